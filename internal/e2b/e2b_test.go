package e2b

import (
	"context"
	"errors"
	"fmt"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
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

// templateSet is the server's templates as the alias resolution sees them.
type templateSet map[string]api.Template

func (ts templateSet) Get(ctx context.Context, name string) (api.Template, error) {
	if name == "broken" {
		return api.Template{}, errors.New("store down")
	}
	if t, ok := ts[name]; ok {
		return t, nil
	}
	return api.Template{}, fmt.Errorf("template %s: %w", name, errdefs.ErrNotFound)
}

// getOnly is a Templates of which alias resolution calls Get alone.
type getOnly struct {
	Templates
	set templateSet
}

func (g getOnly) Get(ctx context.Context, name string) (api.Template, error) {
	return g.set.Get(ctx, name)
}

// TestAliases: "base" is atoll's base template when the server has one,
// else the host template.
func TestAliases(t *testing.T) {
	tests := []struct {
		name    string
		have    Templates
		aliases []string
		want    string
		wantErr bool
	}{
		{"base exists", getOnly{set: templateSet{"base": {Name: "base"}}}, DefaultAliases["base"], "base", false},
		{"no base", getOnly{set: templateSet{"other": {Name: "other"}}}, DefaultAliases["base"], "host", false},
		{"base removed, held by sandboxes", getOnly{set: templateSet{"base": {Name: "base", Removed: true}}}, DefaultAliases["base"], "host", false},
		{"no template store", nil, DefaultAliases["base"], "base", false},
		{"store fails", getOnly{set: templateSet{}}, []string{"broken", "host"}, "", true},
		{"one choice", getOnly{set: templateSet{}}, []string{"host"}, "host", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s := &Server{cfg: Config{Templates: tc.have}}
			got, err := s.aliased(context.Background(), tc.aliases)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Errorf("aliased(%v) = %q, %v; want %q (error %v)", tc.aliases, got, err, tc.want, tc.wantErr)
			}
		})
	}
}
