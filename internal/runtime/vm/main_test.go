package vm_test

import (
	"testing"

	"github.com/atoll-dev/atoll/internal/testenv"
)

// TestMain removes the agent binary the tests built (testenv.AgentBinary).
func TestMain(m *testing.M) { testenv.Main(m) }
