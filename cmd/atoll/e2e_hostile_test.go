package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestHostileInput sends bad input through the real server: every answer is
// a 4xx JSON error and the host is untouched.
func TestHostileInput(t *testing.T) {
	d, _, c := startRooted(t)
	ctx := context.Background()
	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	id := sb.ID
	hostShadow, _ := os.ReadFile("/etc/shadow")
	marker := filepath.Join(testenv.Dir(t), "marker")
	os.WriteFile(marker, []byte("host"), 0o644)

	raw := func(method, path string, body io.Reader) (int, string) {
		req, _ := http.NewRequest(method, d.url+path, body)
		req.Header.Set("Authorization", "Bearer "+d.key)
		return fetch(t, http.DefaultClient, req)
	}
	cases := []struct {
		name, method, path, body string
		want                     int
	}{
		{"unknown field", "POST", "/v1/sandboxes", `{"templat":"host"}`, 400},
		{"malformed json", "POST", "/v1/sandboxes", `{"cpu":`, 400},
		{"negative cpu", "POST", "/v1/sandboxes", `{"cpu":-1}`, 400},
		{"huge memory", "POST", "/v1/sandboxes", `{"memory_mib":99999999999}`, 400},
		{"unknown template", "POST", "/v1/sandboxes", `{"template":"nope"}`, 404},
		{"bad label", "POST", "/v1/sandboxes", `{"labels":{"a b":"c"}}`, 400},
		{"env with NUL", "POST", "/v1/sandboxes", `{"env":{"A\u0000":"b"}}`, 400},
		{"malformed id", "GET", "/v1/sandboxes/..%2f..%2fetc", "", 400},
		{"unknown id", "GET", "/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa", "", 404},
		{"exec unknown id", "POST", "/v1/sandboxes/aaaaaaaaaaaaaaaaaaaa/exec", `{"cmd":["true"]}`, 404},
		{"relative path", "GET", "/v1/sandboxes/" + id + "/files?path=etc/passwd", "", 400},
		{"NUL path", "GET", "/v1/sandboxes/" + id + "/files?path=/etc%00", "", 400},
		{"exec unknown field", "POST", "/v1/sandboxes/" + id + "/exec", `{"command":"x"}`, 400},
		{"unknown pid", "GET", "/v1/sandboxes/" + id + "/processes/999999", "", 404},
		{"bad egress CIDR", "POST", "/v1/sandboxes", `{"network":{"allow":["10.0.0.0/33"]}}`, 400},
		{"bad wildcard", "PUT", "/v1/sandboxes/" + id + "/network", `{"allow":["a.*.example"]}`, 400},
		// This daemon runs with --network off: a policy fails closed.
		// Loopback only cannot let a sandbox reach some places, or deny
		// some (deny-all with nothing allowed it enforces, and is a 201).
		{"policy without networking", "POST", "/v1/sandboxes", `{"network":{"egress":"deny-all","allow":["203.0.113.1"]}}`, 503},
		{"deny list without networking", "POST", "/v1/sandboxes", `{"network":{"deny":["203.0.113.1"]}}`, 503},
		{"network without networking", "GET", "/v1/sandboxes/" + id + "/network", "", 503},
		{"set policy without networking", "PUT", "/v1/sandboxes/" + id + "/network", `{"egress":"deny-all"}`, 503},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := raw(tc.method, tc.path, strings.NewReader(tc.body))
			if code != tc.want || !strings.Contains(body, `"code"`) {
				t.Errorf("%s %s: %d %s, want %d with a JSON error", tc.method, tc.path, code, body, tc.want)
			}
		})
	}
	t.Run("huge body", func(t *testing.T) {
		code, _ := raw("POST", "/v1/sandboxes", strings.NewReader(`{"labels":{"a":"`+strings.Repeat("x", 4<<20)+`"}}`))
		if code != 413 && code != 400 {
			t.Errorf("4 MiB create body: %d", code)
		}
	})

	// Traversal and symlinks resolve inside the sandbox: reading "../../etc/shadow"
	// or through a symlink to /etc/shadow yields the sandbox's file, never the host's.
	sh(t, c, id, "ln -s /etc/shadow /root/link; ln -s ../../../../../../etc/shadow /root/rel")
	for _, p := range []string{"/root/../../../etc/shadow", "/root/link", "/root/rel"} {
		rc, err := c.ReadFile(ctx, id, p)
		if err != nil {
			t.Errorf("read %s: %v", p, err)
			continue
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if len(hostShadow) > 0 && bytes.Equal(b, hostShadow) || !bytes.HasPrefix(b, []byte("root:*:")) {
			t.Errorf("read %s gave %q, want the sandbox's shadow", p, b)
		}
	}
	// Writing through a symlink that points at a host path writes inside the sandbox.
	sh(t, c, id, "ln -s "+marker+" /root/tohost; mkdir -p "+filepath.Dir(marker))
	if _, err := c.WriteFile(ctx, id, "/root/tohost", strings.NewReader("sandbox"), 0o644); err != nil {
		t.Errorf("write through symlink: %v", err)
	}
	if b, _ := os.ReadFile(marker); string(b) != "host" {
		t.Errorf("host file changed to %q", b)
	}

	// Tar slip: refused with a 4xx, nothing written outside the target.
	err := c.UploadTar(ctx, id, "/root/dst", testenv.Tar("../../../../../../"+strings.TrimPrefix(marker, "/"), "slip"))
	var ae *atoll.Error
	if !errors.As(err, &ae) || ae.StatusCode < 400 || ae.StatusCode >= 500 {
		t.Errorf("tar slip upload: %v, want a 4xx", err)
	}
	if b, _ := os.ReadFile(marker); string(b) != "host" {
		t.Errorf("host file changed to %q", b)
	}

	// Wrong or missing key.
	bad := atoll.New(d.url, "atoll_wrong")
	if _, err := bad.ListSandboxes(ctx, atoll.ListOptions{}); !errors.Is(err, atoll.ErrUnauthorized) {
		t.Errorf("wrong key: %v", err)
	}
}
