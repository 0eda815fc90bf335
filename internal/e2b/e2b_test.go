package e2b

import (
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestSandboxTarget(t *testing.T) {
	for _, c := range []struct {
		host   string
		header map[string]string
		want   target
		ok     bool
	}{
		{"127.0.0.1:7400", nil, target{}, false},
		{"api.example.com", nil, target{}, false},
		{"localhost", nil, target{}, false},
		{"49983-abc.example.com", nil, target{"abc", "49983"}, true},
		{"49983-abc-client.example.com:443", nil, target{"abc-client", "49983"}, true},
		{"x49983-abc.example.com", nil, target{}, false},
		{"123456-abc.example.com", nil, target{}, false},
		{"127.0.0.1:7400", map[string]string{"E2b-Sandbox-Id": "abc", "E2b-Sandbox-Port": "8080"}, target{"abc", "8080"}, true},
	} {
		r := httptest.NewRequest("GET", "/health", nil)
		r.Host = c.host
		for k, v := range c.header {
			r.Header.Set(k, v)
		}
		got, ok := sandboxTarget(r)
		if ok != c.ok || got != c.want {
			t.Errorf("%s %v: %+v, %v; want %+v, %v", c.host, c.header, got, ok, c.want, c.ok)
		}
	}
}

// The SDKs encode metadata filters twice: each key and value, then the
// whole query string.
func TestMetadataFilter(t *testing.T) {
	got, err := metadataFilter("user=a%2520b&app=prod%253Dx")
	if err != nil {
		t.Fatal(err)
	}
	if want := map[string]string{"user": "a b", "app": "prod=x"}; !cmp.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
	if _, err := metadataFilter("a=%zz"); err == nil {
		t.Error("bad escape accepted")
	}
}

func TestCheckMetadata(t *testing.T) {
	for md, ok := range map[string]bool{"team/name": true, "a b": false, "": false, "k=v": false, "ключ": false} {
		if err := checkMetadata(map[string]string{md: "v"}); (err == nil) != ok {
			t.Errorf("key %q: %v", md, err)
		}
	}
	if err := checkMetadata(map[string]string{"k": "\xff"}); err == nil {
		t.Error("invalid UTF-8 value accepted")
	}
}

func TestCursor(t *testing.T) {
	c := cursor{time.Unix(1700000000, 123456789).UTC(), "abcdefghij0123456789"}
	got, err := parseCursor(c.String())
	if err != nil || !got.t.Equal(c.t) || got.id != c.id {
		t.Errorf("round trip: %+v, %v", got, err)
	}
	for _, bad := range []string{"%%%", "bm9wZQ", ""} {
		if _, err := parseCursor(bad); err == nil {
			t.Errorf("parseCursor(%q) succeeded", bad)
		}
	}
}
