package atoll_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestSeveralURLs: a client given the URLs of several nodes goes on to the
// next when it cannot connect to one, stays there, and sends a stream's
// body to no second server.
func TestSeveralURLs(t *testing.T) {
	var hits atomic.Int32
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		json.NewEncoder(w).Encode(api.Health{Status: "ok"})
	}))
	defer up.Close()
	// An address nothing listens on: connections are refused.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := "http://" + ln.Addr().String()
	ln.Close()

	c := atoll.New(down+", "+up.URL+"/", "key")
	for range 3 {
		if h, err := c.Health(context.Background()); err != nil || h.Status != "ok" {
			t.Fatalf("health over %s,%s: %+v, %v", down, up.URL, h, err)
		}
	}
	if hits.Load() != 3 {
		t.Errorf("the server that is up answered %d of 3", hits.Load())
	}

	// Every one down: the error says it could not connect.
	c = atoll.New(down+","+down, "key")
	if _, err := c.Health(context.Background()); err == nil || !strings.Contains(err.Error(), "refused") {
		t.Errorf("health with every server down: %v", err)
	}

	// A stream is not sent twice: it goes where the client is now.
	c = atoll.New(down+","+up.URL, "key")
	if _, err := c.WriteFile(context.Background(), "sbx", "/f", strings.NewReader("data"), 0o644); err == nil {
		t.Error("a streamed write to a server that is down succeeded")
	}
}
