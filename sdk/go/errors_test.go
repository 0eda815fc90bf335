package atoll

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
)

// TestErrorTable checks that the SDK reads every row of api.ErrorCodes
// back: an answer the server's kit writes for a kind is that kind's sentinel
// and status, so is a bare status (a proxy's), and so is an error event of a
// stream.
func TestErrorTable(t *testing.T) {
	for _, row := range api.ErrorCodes {
		kind := errdefs.FromCode(row.Code)
		sentinel := kinds[row.Code]
		if (kind == nil) != (sentinel == nil) {
			t.Errorf("%s: errdefs kind %v, SDK sentinel %v", row.Code, kind, sentinel)
		}
		if sentinel != nil && sentinel.Error() != kind.Error() {
			t.Errorf("%s: SDK says %q, errdefs %q", row.Code, sentinel, kind)
		}
		ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			err := fmt.Errorf("%w: something", kind)
			httpkit.Atoll.Error(w, errdefs.Status(err), errdefs.Code(err), err.Error())
		}))
		resp, err := http.Get(ts.URL)
		if err != nil {
			t.Fatal(err)
		}
		err = errorFrom(resp)
		resp.Body.Close()
		ts.Close()
		var e *Error
		if !errors.As(err, &e) || e.StatusCode != row.Status || e.Code != row.Code {
			t.Errorf("%s: read %#v, want status %d", row.Code, err, row.Status)
		}
		if sentinel == nil {
			continue
		}
		if !errors.Is(err, sentinel) {
			t.Errorf("%s: %v is not %v", row.Code, err, sentinel)
		}
		for _, st := range append([]int{row.Status}, row.Also...) {
			if bare := (&Error{StatusCode: st}); !errors.Is(bare, sentinel) {
				t.Errorf("%s: a bare %d is not %v", row.Code, st, sentinel)
			}
		}
		if ev := errorOfCode(row.Code, "something"); ev.StatusCode != row.Status || !errors.Is(ev, sentinel) {
			t.Errorf("%s: stream error %+v, want status %d", row.Code, ev, row.Status)
		}
	}
}
