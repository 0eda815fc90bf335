package main

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/url"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/network/nettest"
	"github.com/atoll-dev/atoll/internal/testenv"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestAutoResumeEndToEnd runs `atoll serve` with networking and its port
// proxy, and checks that a paused auto-resume sandbox is woken by a request
// to one of its ports or to its agent, the request waiting for it and
// answered as if it had been running; that its timeout pauses it instead of
// stopping it; that it wakes after a kill -9 of the server; and that a
// sandbox without the option, another tenant's key and a deleted sandbox
// wake nothing.
func TestAutoResumeEndToEnd(t *testing.T) {
	testenv.RequireRoot(t)
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	w := newNetWorld(t)
	d := startDaemonIn(t, filepath.Join(testenv.Dir(t), "data"), w.host, "--network", "on", "--network-bridge", w.id,
		"--dns-upstream", wInet4, "--warm-pool", "0", "--prestart", "0", "--network-pool", "1",
		"--proxy-listen", "127.0.0.1:0", "--proxy-domain", "sb.test")
	c := d.client()
	ctx := context.Background()

	var proxyAddr string
	toProxy := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (conn net.Conn, err error) {
			err = nettest.In(w.host, func() (err error) {
				conn, err = (&net.Dialer{}).DialContext(ctx, "tcp", proxyAddr)
				return err
			})
			return conn, err
		},
		DisableKeepAlives: true,
	}}
	get := func(u string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", u, nil)
		return fetch(t, toProxy, req)
	}
	portURL := func(id string) string {
		t.Helper()
		pu, err := c.PortURL(ctx, id, 8080, 0)
		if err != nil {
			t.Fatal(err)
		}
		u, _ := url.Parse(pu.URL)
		proxyAddr = net.JoinHostPort("127.0.0.1", u.Port())
		return pu.URL
	}
	state := func(id string) api.Sandbox {
		t.Helper()
		sb, err := c.GetSandbox(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		return sb
	}
	serve := func(id string) string {
		t.Helper()
		if _, err := c.WriteFile(ctx, id, "/tmp/files.py", strings.NewReader(fileServer), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, code := sh(t, c, id, "echo hello from "+id+" > /tmp/index.html"); code != 0 {
			t.Fatal(out)
		}
		if _, err := c.StartProcess(ctx, id, api.ExecRequest{Cmd: []string{"python3", "/tmp/files.py"}, Background: true}); err != nil {
			t.Fatal(err)
		}
		u := portURL(id)
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
			if code, _ := get(u); code == 200 {
				return u
			}
			if time.Now().After(deadline) {
				t.Fatalf("the sandbox's server never answered through the proxy")
			}
		}
	}

	sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{AutoResume: true, TimeoutSec: 3600, Ports: &api.PortAccess{Public: true}})
	if !sb.AutoResume {
		t.Fatalf("create answered %+v without auto_resume", sb)
	}
	id := sb.ID
	u := serve(id)
	want := "hello from " + id + "\n"
	plain := newSandbox(ctx, t, c, api.CreateSandboxRequest{Ports: &api.PortAccess{Public: true}})
	plainURL := serve(plain.ID)

	t.Run("a port wakes it", func(t *testing.T) {
		if _, err := c.PauseSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		if sb := state(id); sb.State != api.StatePaused || sb.ExpiresAt != nil {
			t.Fatalf("paused: %+v (an auto-resume sandbox has no timeout while paused)", sb)
		}
		// Concurrent requests all wait for the one resume.
		var wg sync.WaitGroup
		var mu sync.Mutex
		var got []string
		for range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				resp, err := toProxy.Get(u)
				if err != nil {
					t.Errorf("GET: %v", err)
					return
				}
				defer resp.Body.Close()
				b, _ := io.ReadAll(resp.Body)
				mu.Lock()
				got = append(got, resp.Status+" "+string(b))
				mu.Unlock()
			}()
		}
		wg.Wait()
		for _, g := range got {
			if g != "200 OK "+want {
				t.Errorf("a request to a paused auto-resume sandbox: %q", g)
			}
		}
		if sb := state(id); sb.State != api.StateRunning || sb.ExpiresAt == nil || time.Until(*sb.ExpiresAt) < 3500*time.Second {
			t.Errorf("after the wake: %+v (want running, its timeout counted from now)", sb)
		}
	})

	t.Run("its agent wakes it", func(t *testing.T) {
		if _, err := c.PauseSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		if out, code := sh(t, c, id, "echo awake"); code != 0 || out != "awake\n" {
			t.Errorf("exec in a paused auto-resume sandbox: %q %d", out, code)
		}
		if sb := state(id); sb.State != api.StateRunning {
			t.Errorf("after exec: %s", sb.State)
		}
	})

	t.Run("without the option nothing wakes", func(t *testing.T) {
		if _, err := c.PauseSandbox(ctx, plain.ID); err != nil {
			t.Fatal(err)
		}
		if code, body := get(plainURL); code == 200 {
			t.Errorf("a paused sandbox without auto_resume answered through the proxy: %q", body)
		}
		if _, err := c.Exec(ctx, plain.ID, api.ExecRequest{Shell: "true"}, io.Discard, io.Discard); !errors.Is(err, atoll.ErrConflict) {
			t.Errorf("exec in a paused sandbox without auto_resume: %v, want conflict", err)
		}
		if sb := state(plain.ID); sb.State != api.StatePaused {
			t.Errorf("it woke: %s", sb.State)
		}
	})

	t.Run("another tenant's key wakes nothing", func(t *testing.T) {
		key, code := d.cli("key", "create", "--name", "other-team")
		if code != 0 {
			t.Fatalf("key create: %s", key)
		}
		if _, err := c.PauseSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		theirs := d.clientWith(strings.TrimSpace(key))
		if _, err := theirs.Exec(ctx, id, api.ExecRequest{Shell: "true"}, io.Discard, io.Discard); !errors.Is(err, atoll.ErrNotFound) {
			t.Errorf("another tenant's exec: %v, want not found", err)
		}
		if _, err := theirs.PortURL(ctx, id, 8080, 0); !errors.Is(err, atoll.ErrNotFound) {
			t.Errorf("another tenant's port URL: %v, want not found", err)
		}
		if sb := state(id); sb.State != api.StatePaused {
			t.Errorf("another tenant's request woke it: %s", sb.State)
		}
	})

	t.Run("after a kill -9 of the server", func(t *testing.T) {
		if sb := state(id); sb.State != api.StatePaused {
			t.Fatalf("want it paused: %s", sb.State)
		}
		d.kill()
		time.Sleep(time.Second)
		d.start()
		c = d.client()
		u = portURL(id) // the proxy listens on a new port
		if code, body := get(u); code != 200 || body != want {
			t.Errorf("a request after the restart: %d %q", code, body)
		}
		if sb := state(id); sb.State != api.StateRunning {
			t.Errorf("after the restart and a request: %s", sb.State)
		}
	})

	t.Run("its timeout pauses it", func(t *testing.T) {
		if _, err := c.SetTimeout(ctx, id, time.Second); err != nil {
			t.Fatal(err)
		}
		for deadline := time.Now().Add(15 * time.Second); state(id).State != api.StatePaused; time.Sleep(200 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("not paused at its timeout: %+v", state(id))
			}
		}
		if code, body := get(u); code != 200 || body != want {
			t.Errorf("a request after the timeout: %d %q", code, body)
		}
	})

	t.Run("a suspended one wakes", func(t *testing.T) {
		testenv.RequireCommand(t, "runsc")
		g := newSandbox(ctx, t, c, api.CreateSandboxRequest{Runtime: "gvisor", AutoResume: true})
		defer c.DeleteSandbox(ctx, g.ID)
		if out, code := sh(t, c, g.ID, "echo 41 > /tmp/n"); code != 0 {
			t.Fatal(out)
		}
		if _, err := c.SuspendSandbox(ctx, g.ID); err != nil {
			t.Fatal(err)
		}
		if sb := state(g.ID); sb.State != api.StateSuspended {
			t.Fatalf("suspend: %s", sb.State)
		}
		if out, code := sh(t, c, g.ID, "cat /tmp/n"); code != 0 || out != "41\n" {
			t.Errorf("exec in a suspended auto-resume sandbox: %q %d", out, code)
		}
		if sb := state(g.ID); sb.State != api.StateRunning {
			t.Errorf("after exec: %s", sb.State)
		}
	})

	t.Run("a deleted sandbox", func(t *testing.T) {
		if _, err := c.PauseSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Fatal(err)
		}
		if code, _ := get(u); code != http.StatusNotFound {
			t.Errorf("a request to a deleted auto-resume sandbox: %d, want 404", code)
		}
		if _, err := c.Exec(ctx, id, api.ExecRequest{Shell: "true"}, io.Discard, io.Discard); !errors.Is(err, atoll.ErrNotFound) {
			t.Errorf("exec in a deleted sandbox: %v, want not found", err)
		}
	})
}
