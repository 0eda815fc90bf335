package envd

import (
	"fmt"
	"net/http"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// TestErrorTable checks envd's statuses against api.ErrorCodes: the same
// but for the differences E2B's envd has (507 for a full disk; unavailable
// and internal answers of the agent are 500, an agent that did not answer
// is a sandbox gone, 502).
func TestErrorTable(t *testing.T) {
	differs := map[string][2]int{ // code: the agent answered, the error came from elsewhere
		api.CodeQuota:       {http.StatusInsufficientStorage, http.StatusInsufficientStorage},
		api.CodeForbidden:   {http.StatusInternalServerError, http.StatusBadGateway},
		api.CodeUnavailable: {http.StatusInternalServerError, http.StatusBadGateway},
		api.CodeInternal:    {http.StatusInternalServerError, http.StatusBadGateway},
	}
	for _, row := range api.ErrorCodes {
		answered := &agent.StatusError{Status: row.Status, Code: row.Code, Message: "something"}
		var other error = fmt.Errorf("dialing the agent: something")
		if kind := errdefs.FromCode(row.Code); kind != nil {
			other = fmt.Errorf("%w: something", kind)
		}
		want := [2]int{row.Status, row.Status}
		if d, ok := differs[row.Code]; ok {
			want = d
		}
		if got := [2]int{httpStatus(answered), httpStatus(other)}; got != want {
			t.Errorf("%s: statuses %v, want %v", row.Code, got, want)
		}
	}
}
