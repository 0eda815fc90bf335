package control

import (
	"os"
	"testing"

	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestMain removes the agent binary the tests built (testenv.AgentBinary).
func TestMain(m *testing.M) {
	code := m.Run()
	testenv.RemoveAgentBinary()
	os.Exit(code)
}
