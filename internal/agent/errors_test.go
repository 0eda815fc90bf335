package agent

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// TestErrorTable checks the agent's answers against api.ErrorCodes: the same
// status and code for every kind, but 507 for a full disk.
func TestErrorTable(t *testing.T) {
	for _, row := range api.ErrorCodes {
		err := errors.New("something")
		if kind := errdefs.FromCode(row.Code); kind != nil {
			err = errorf(kind, "something")
		}
		w := httptest.NewRecorder()
		writeError(w, err)
		var got api.Error
		if err := json.Unmarshal(w.Body.Bytes(), &got); err != nil {
			t.Fatalf("%s: body %q: %v", row.Code, w.Body, err)
		}
		want := api.Error{Code: row.Code, Message: "something"}
		status := row.Status
		switch row.Code {
		case api.CodeQuota:
			status = http.StatusInsufficientStorage
		case api.CodeInternal:
			want.Message = "internal error: something"
		}
		if w.Code != status || got != want {
			t.Errorf("%s: answered %d %+v, want %d %+v", row.Code, w.Code, got, status, want)
		}
	}
}
