package httpkit

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

func TestDecodeJSON(t *testing.T) {
	type req struct {
		Name string `json:"name"`
	}
	for _, c := range []struct {
		name string
		body string
		b    Body
		kind error  // nil: decoded
		msg  string // in the error's message
	}{
		{"ok", `{"name":"x"}`, Body{Limit: 64}, nil, ""},
		{"empty", ``, Body{Limit: 64}, errdefs.ErrInvalid, "request body is empty"},
		{"empty allowed", ``, Body{Limit: 64, EmptyOK: true}, nil, ""},
		{"too large", `{"name":"` + strings.Repeat("x", 100) + `"}`, Body{Limit: 64}, errdefs.ErrTooLarge, "larger than 64 bytes"},
		{"unknown field", `{"name":"x","other":1}`, Body{Limit: 64}, errdefs.ErrInvalid, `malformed JSON body: unknown field "other"`},
		{"unknown field, lenient", `{"name":"x","other":1}`, Body{Limit: 64, Lenient: true}, nil, ""},
		{"two values", `{"name":"x"} {}`, Body{Limit: 64}, errdefs.ErrInvalid, "more than one JSON value"},
		{"trailing garbage", `{"name":"x"} }`, Body{Limit: 64}, errdefs.ErrInvalid, "malformed JSON body"},
		{"truncated", `{"name":`, Body{Limit: 64}, errdefs.ErrInvalid, "malformed JSON body: unexpected EOF"},
		{"wrong type", `{"name":1}`, Body{Limit: 64, Malformed: "Error when parsing request"}, errdefs.ErrInvalid, "Error when parsing request: cannot unmarshal"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := httptest.NewRequest("POST", "/", strings.NewReader(c.body))
			var v req
			err := DecodeJSON(httptest.NewRecorder(), r, &v, c.b)
			if c.kind == nil {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, c.kind) || !strings.Contains(err.Error(), c.msg) {
				t.Errorf("got %v, want %v containing %q", err, c.kind, c.msg)
			}
		})
	}
	// A body over the limit without a Content-Length is cut off as it is read.
	r := httptest.NewRequest("POST", "/", io.MultiReader(strings.NewReader(`{"name":"`), strings.NewReader(strings.Repeat("x", 100))))
	r.ContentLength = -1
	if err := DecodeJSON(httptest.NewRecorder(), r, new(req), Body{Limit: 64}); !errors.Is(err, errdefs.ErrTooLarge) {
		t.Errorf("streamed body over the limit: %v", err)
	}
}

func TestRecover(t *testing.T) {
	log := slog.New(slog.DiscardHandler)
	for _, c := range []struct {
		name    string
		h       http.HandlerFunc
		surface Surface
		status  int
		body    string
	}{
		{"panic", func(http.ResponseWriter, *http.Request) { panic("boom") }, Atoll, 500, `{"code":"internal","message":"internal error"}` + "\n"},
		{"panic, E2B", func(http.ResponseWriter, *http.Request) { panic("boom") }, E2B, 500, `{"code":500,"message":"internal error"}` + "\n"},
		{"panic after the answer began", func(w http.ResponseWriter, _ *http.Request) {
			w.WriteHeader(http.StatusAccepted)
			io.WriteString(w, "partial")
			panic("boom")
		}, Atoll, 202, "partial"},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := httptest.NewRecorder()
			LogRequests(log, "request", c.surface.Recover(log, c.h)).ServeHTTP(w, httptest.NewRequest("GET", "/", nil))
			if w.Code != c.status || w.Body.String() != c.body {
				t.Errorf("got %d %q, want %d %q", w.Code, w.Body, c.status, c.body)
			}
		})
	}
	// http.ErrAbortHandler goes on to net/http.
	defer func() {
		if v := recover(); v != http.ErrAbortHandler {
			t.Errorf("recovered %v, want http.ErrAbortHandler", v)
		}
	}()
	Atoll.Recover(log, http.HandlerFunc(func(http.ResponseWriter, *http.Request) { panic(http.ErrAbortHandler) })).
		ServeHTTP(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil))
}

func TestStatusWriter(t *testing.T) {
	w := httptest.NewRecorder()
	sw := Record(w)
	if Record(sw) != sw {
		t.Error("Record wrapped a StatusWriter again")
	}
	sw.Write([]byte("x"))
	sw.WriteHeader(http.StatusTeapot) // too late: net/http ignores it, and so does the record
	if sw.Status() != http.StatusOK {
		t.Errorf("status %d after a write", sw.Status())
	}
	if err := http.NewResponseController(sw).Flush(); err != nil || !w.Flushed {
		t.Errorf("flush through the StatusWriter: %v, flushed %v", err, w.Flushed)
	}
}

func TestSurfaceStatus(t *testing.T) {
	s := Surface{Body: Atoll.Body, Statuses: map[string]int{"quota_exceeded": 507}}
	for err, want := range map[error]int{
		errdefs.ErrQuota:    507,
		errdefs.ErrNotFound: 404,
		errors.New("a bug"): 500,
	} {
		if got := s.Status(err); got != want {
			t.Errorf("%v: %d, want %d", err, got, want)
		}
	}
	w := httptest.NewRecorder()
	Atoll.JSON(w, http.StatusOK, map[string]any{"ch": make(chan int)})
	if w.Code != 500 || w.Header().Get("Content-Type") != "application/json" {
		t.Errorf("a body that does not marshal: %d %q", w.Code, w.Body)
	}
}

func TestClientMessage(t *testing.T) {
	_, oserr := os.Open("/var/lib/atoll/secret/nothing-here")
	for _, c := range []struct {
		err  error
		want string
	}{
		{fmt.Errorf("%w: no sandbox x", errdefs.ErrNotFound), "not found: no sandbox x"},
		{fmt.Errorf("%w: reading layer: %w", errdefs.ErrNotFound, oserr), "not found"},
	} {
		if got := ClientMessage(c.err, errdefs.ErrNotFound); got != c.want {
			t.Errorf("ClientMessage(%q) = %q, want %q", c.err, got, c.want)
		}
	}
}
