package webhooks

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
)

// TestPrivateRefused: without AllowPrivate, URLs on private, loopback and
// link-local addresses are refused at create, and a connection to such
// an address is refused when dialled, whatever name led there.
func TestPrivateRefused(t *testing.T) {
	s := New(Config{})
	for _, u := range []string{"http://127.0.0.1/x", "http://localhost:8080/", "https://foo.localhost/", "http://10.1.2.3/",
		"http://192.168.1.1/", "http://[::1]/", "http://169.254.169.254/latest/meta-data", "http://[fe80::1]/", "http://0.0.0.0/",
		"http://100.64.0.1/", "http://[::ffff:127.0.0.1]/"} {
		if err := s.checkURL(u); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("checkURL(%s) = %v, want invalid", u, err)
		}
	}
	for _, u := range []string{"https://example.com/hook", "http://203.0.113.7:8080/x"} {
		if err := s.checkURL(u); err != nil {
			t.Errorf("checkURL(%s) = %v", u, err)
		}
	}
	hit := false
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hit = true }))
	defer hs.Close()
	w := store.Webhook{ID: "w", URL: hs.URL, Secret: "s"}
	if _, err := s.send(context.Background(), w, store.Delivery{Event: store.Event{ID: "e"}}, []byte("{}"), time.Now()); err == nil || !strings.Contains(err.Error(), "not public") || hit {
		t.Errorf("send to loopback without AllowPrivate: %v (reached: %v)", err, hit)
	}
	allowed := New(Config{AllowPrivate: true})
	if status, err := allowed.send(context.Background(), w, store.Delivery{Event: store.Event{ID: "e"}}, []byte("{}"), time.Now()); err != nil || status != 200 || !hit {
		t.Errorf("send to loopback with AllowPrivate: %d %v", status, err)
	}
}

// TestSignature: Verify accepts what Sign made, and refuses another body,
// secret or an old timestamp.
func TestSignature(t *testing.T) {
	now := time.Now()
	body := []byte(`{"type":"created"}`)
	h := Sign("whsec_x", now, body)
	if err := Verify("whsec_x", h, body, now, time.Minute); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"body":   Verify("whsec_x", h, []byte(`{"type":"deleted"}`), now, time.Minute),
		"secret": Verify("whsec_y", h, body, now, time.Minute),
		"old":    Verify("whsec_x", h, body, now.Add(time.Hour), time.Minute),
		"none":   Verify("whsec_x", "", body, now, time.Minute),
	} {
		if err == nil {
			t.Errorf("a changed %s verified", name)
		}
	}
}
