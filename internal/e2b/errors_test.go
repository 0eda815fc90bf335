package e2b

import (
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// TestErrorTable checks that the E2B API answers each kind with the status
// of api.ErrorCodes, in E2B's body (the status again as code), and the
// message without the kind's name.
func TestErrorTable(t *testing.T) {
	s := &Server{log: slog.New(slog.DiscardHandler)}
	r := httptest.NewRequest("GET", "/sandboxes", nil)
	for _, row := range api.ErrorCodes {
		err := errors.New("a bug")
		if kind := errdefs.FromCode(row.Code); kind != nil {
			err = fmt.Errorf("%w: something", kind)
		}
		w := httptest.NewRecorder()
		s.writeErr(w, r, err)
		var body apiError
		if err := json.Unmarshal(w.Body.Bytes(), &body); err != nil {
			t.Fatalf("%s: body %q: %v", row.Code, w.Body, err)
		}
		want := apiError{Code: row.Status, Message: "something"}
		if row.Code == api.CodeInternal {
			want.Message = "internal error"
		}
		if w.Code != row.Status || body != want {
			t.Errorf("%s: answered %d %+v, want %d %+v", row.Code, w.Code, body, row.Status, want)
		}
	}
	// A body that does not marshal is a bug, answered in E2B's shape.
	w := httptest.NewRecorder()
	writeJSON(w, http.StatusOK, map[string]any{"x": make(chan int)})
	if w.Code != http.StatusInternalServerError || w.Body.String() != `{"code":500,"message":"internal error"}`+"\n" {
		t.Errorf("unmarshalable body answered %d %q", w.Code, w.Body)
	}
}
