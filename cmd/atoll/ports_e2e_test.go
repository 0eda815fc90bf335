package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/network"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// upgradeServer is a sandbox's server on 8081: a request with "Upgrade:
// echo" becomes a line echo over the connection (the shape of a
// websocket), any other a chunked stream of three lines 300 ms apart.
const upgradeServer = `import socket, threading, time
def handle(c):
    f = c.makefile("rb")
    f.readline()
    hdrs = {}
    while True:
        l = f.readline()
        if l in (b"\r\n", b"\n", b""):
            break
        k, _, v = l.decode().partition(":")
        hdrs[k.strip().lower()] = v.strip()
    if hdrs.get("upgrade") == "echo":
        c.sendall(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
        while True:
            d = f.readline()
            if not d:
                break
            c.sendall(d)
    else:
        c.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: text/plain\r\n\r\n")
        for i in range(3):
            m = b"chunk %d\n" % i
            c.sendall(b"%x\r\n%s\r\n" % (len(m), m))
            time.sleep(0.3)
        c.sendall(b"0\r\n\r\n")
    c.close()
s = socket.socket(socket.AF_INET6)
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("::", 8081))
s.listen(64)
while True:
    c, _ = s.accept()
    threading.Thread(target=handle, args=(c,), daemon=True).start()
`

// fileServer serves /tmp on 8080 over HTTP/1.1 with keep-alive.
const fileServer = `import http.server as h, functools
h.SimpleHTTPRequestHandler.protocol_version = "HTTP/1.1"
h.SimpleHTTPRequestHandler.disable_nagle_algorithm = True
h.ThreadingHTTPServer.address_family = __import__("socket").AF_INET6
s = h.ThreadingHTTPServer(("::", 8080), functools.partial(h.SimpleHTTPRequestHandler, directory="/tmp"))
s.serve_forever()
`

// startPortsDaemon starts `atoll serve` with networking and its port
// proxy (domain sb.test) in a netWorld of its own.
func startPortsDaemon(t *testing.T) (*netWorld, *daemon) {
	t.Helper()
	testenv.RequireRoot(t)
	if err := network.Probe(); err != nil {
		testenv.Skip(t, err.Error())
	}
	w := newNetWorld(t)
	data := testenv.Dir(t)
	linkVMCache(t, data) // for vm sandboxes, if a test makes any
	d := startDaemonIn(t, data, w.host, "--network", "on", "--network-bridge", w.id,
		"--dns-upstream", wInet4, "--warm-pool", "1", "--prestart", "0", "--network-pool", "1",
		"--proxy-listen", "127.0.0.1:0", "--proxy-domain", "sb.test")
	return w, d
}

// TestPortsEndToEnd runs the real `atoll serve` with networking on in a
// namespace of its own, and opens sandboxes' ports through its port proxy:
// by Host and by headers, streams and upgrades, public and token-protected
// sandboxes, signed URLs, and auto-stop activity. It logs the proxy's
// latency and throughput against a direct connection.
func TestPortsEndToEnd(t *testing.T) {
	w, d := startPortsDaemon(t)
	c := d.client()
	ctx := context.Background()

	// inHost dials from the daemon's namespace; toProxy dials the proxy
	// whatever the URL's host, as a resolver for *.sb.test would.
	inHost := func(ctx context.Context, addr string) (net.Conn, error) { return w.dial(ctx, "tcp", addr) }
	var proxyAddr string
	toProxy := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext:     func(ctx context.Context, _, _ string) (net.Conn, error) { return inHost(ctx, proxyAddr) },
		MaxConnsPerHost: 4,
	}}
	direct := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) { return inHost(ctx, addr) },
	}}
	get := func(cl *http.Client, u string, h map[string]string) (int, string) {
		t.Helper()
		req, err := http.NewRequest("GET", u, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range h {
			if k == "Host" {
				req.Host = v
			} else {
				req.Header.Set(k, v)
			}
		}
		return fetch(t, cl, req)
	}
	serve := func(id string) {
		t.Helper()
		for name, src := range map[string]string{"/tmp/files.py": fileServer, "/tmp/upgrade.py": upgradeServer} {
			if _, err := c.WriteFile(ctx, id, name, strings.NewReader(src), 0o644); err != nil {
				t.Fatal(err)
			}
			if _, err := c.StartProcess(ctx, id, api.ExecRequest{Cmd: []string{"python3", name}, Background: true}); err != nil {
				t.Fatal(err)
			}
		}
		if out, code := sh(t, c, id, "echo hello from "+id+" > /tmp/index.html && head -c 134217728 /dev/zero > /tmp/big"); code != 0 {
			t.Fatal(out)
		}
	}

	pub, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Ports: &api.PortAccess{Public: true}})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, d.out.String())
	}
	priv := newSandbox(ctx, t, c, api.CreateSandboxRequest{})
	if !pub.Ports.Public || priv.Ports.Public {
		t.Fatalf("ports: %+v %+v", pub.Ports, priv.Ports)
	}
	serve(pub.ID)
	serve(priv.ID)
	pu, err := c.PortURL(ctx, pub.ID, 8080, 0)
	if err != nil {
		t.Fatal(err)
	}
	pURL, _ := url.Parse(pu.URL)
	proxyAddr = net.JoinHostPort("127.0.0.1", pURL.Port())
	if pURL.Hostname() != "8080-"+pub.ID+".sb.test" || pu.Token != "" {
		t.Fatalf("port URL: %+v", pu)
	}
	// Wait for the servers.
	deadline := time.Now().Add(20 * time.Second)
	for {
		code, _ := get(toProxy, pu.URL, nil)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the public sandbox's server never answered through the proxy: %d", code)
		}
		time.Sleep(200 * time.Millisecond)
	}

	t.Run("by host and by headers", func(t *testing.T) {
		if code, body := get(toProxy, pu.URL, nil); code != 200 || body != "hello from "+pub.ID+"\n" {
			t.Errorf("by host: %d %q", code, body)
		}
		h := map[string]string{"Host": "proxy.example", "Atoll-Sandbox-Id": pub.ID, "Atoll-Sandbox-Port": "8080"}
		if code, body := get(toProxy, "http://proxy/", h); code != 200 || body != "hello from "+pub.ID+"\n" {
			t.Errorf("by headers: %d %q", code, body)
		}
		out, code := d.cli("port", pub.ID, "8080")
		if code != 0 || strings.TrimSpace(out) != pu.URL {
			t.Errorf("atoll port: %q (%d), want %s", out, code, pu.URL)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		port := pURL.Port()
		for _, tc := range []struct {
			host string
			want int
		}{
			{"0-" + pub.ID + ".sb.test", 400},
			{"65536-" + pub.ID + ".sb.test", 400},
			{"http-" + pub.ID + ".sb.test", 400},
			{"8080-NOTANID.sb.test", 400},
			{"8080-aaaaaaaaaaaaaaaaaaaa.sb.test", 404},
			{"9-" + pub.ID + ".sb.test", 502},
		} {
			code, body := get(toProxy, "http://"+tc.host+":"+port+"/", nil)
			if code != tc.want || !strings.Contains(body, `"code"`) {
				t.Errorf("%s: %d %q, want %d", tc.host, code, body, tc.want)
			}
		}
		for _, p := range []string{"0", "65536", "x"} {
			if out, code := d.cli("port", pub.ID, p); code == 0 {
				t.Errorf("atoll port %s: %q", p, out)
			}
		}
		if _, err := c.PortURL(ctx, pub.ID, 0, 0); err == nil {
			t.Error("PortURL port 0 works")
		}
	})

	t.Run("stream and upgrade", func(t *testing.T) {
		conn, err := inHost(ctx, proxyAddr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		br := bufio.NewReader(conn)
		host := "8081-" + pub.ID + ".sb.test"
		fmt.Fprintf(conn, "GET /stream HTTP/1.1\r\nHost: %s\r\n\r\n", host)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		t0 := time.Now()
		body := bufio.NewReader(resp.Body)
		line, err := body.ReadString('\n')
		if err != nil || line != "chunk 0\n" || time.Since(t0) > 250*time.Millisecond {
			t.Errorf("first chunk %q %v after %v: want it at once", line, err, time.Since(t0))
		}
		rest, _ := io.ReadAll(body)
		if string(rest) != "chunk 1\nchunk 2\n" || time.Since(t0) < 500*time.Millisecond {
			t.Errorf("rest %q after %v", rest, time.Since(t0))
		}
		fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", host)
		resp, err = http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 101 {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		for i := 0; i < 3; i++ {
			msg := fmt.Sprintf("message %d\n", i)
			io.WriteString(conn, msg)
			if got, err := br.ReadString('\n'); err != nil || got != msg {
				t.Fatalf("echo: %q %v", got, err)
			}
		}
	})

	t.Run("a private sandbox needs a token or a signed URL", func(t *testing.T) {
		u, err := c.PortURL(ctx, priv.ID, 8080, time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		if u.Public || u.Token == "" || u.SignedURL == "" || u.ExpiresAt == nil {
			t.Fatalf("port URL: %+v", u)
		}
		if code, _ := get(toProxy, u.URL, nil); code != 401 {
			t.Errorf("no token: %d, want 401", code)
		}
		if code, _ := get(toProxy, u.URL, map[string]string{"Atoll-Access-Token": "atp_guess"}); code != 401 {
			t.Errorf("a wrong token: %d, want 401", code)
		}
		if code, body := get(toProxy, u.URL, map[string]string{"Atoll-Access-Token": u.Token}); code != 200 || !strings.Contains(body, priv.ID) {
			t.Errorf("token: %d %q", code, body)
		}
		h := map[string]string{"Host": "x", "Atoll-Sandbox-Id": priv.ID, "Atoll-Sandbox-Port": "8080"}
		if code, _ := get(toProxy, "http://x/", h); code != 401 {
			t.Errorf("by headers without a token: %d, want 401", code)
		}
		h["Atoll-Access-Token"] = u.Token
		if code, _ := get(toProxy, "http://x/", h); code != 200 {
			t.Errorf("by headers with the token: %d", code)
		}
		if code, body := get(toProxy, u.SignedURL, nil); code != 200 || !strings.Contains(body, priv.ID) {
			t.Errorf("signed URL: %d %q", code, body)
		}
		tampered := strings.Replace(u.SignedURL, "atoll_sig=", "atoll_sig=x", 1)
		if code, _ := get(toProxy, tampered, nil); code != 401 {
			t.Errorf("tampered signature: %d, want 401", code)
		}
		exp := strconv.FormatInt(u.ExpiresAt.Unix(), 10)
		longer := strings.Replace(u.SignedURL, "atoll_expires="+exp, "atoll_expires="+strconv.FormatInt(u.ExpiresAt.Unix()+3600, 10), 1)
		if code, _ := get(toProxy, longer, nil); code != 401 {
			t.Errorf("extended expiry: %d, want 401", code)
		}
		out, code := d.cli("port", priv.ID, "8080", "--signed", "--ttl", "2s")
		if code != 0 || !strings.Contains(out, "atoll_sig=") {
			t.Fatalf("atoll port --signed: %q", out)
		}
		short := strings.TrimSpace(out)
		if code, _ := get(toProxy, short, nil); code != 200 {
			t.Errorf("a fresh signed URL: %d", code)
		}
		time.Sleep(3 * time.Second)
		if code, _ := get(toProxy, short, nil); code != 401 {
			t.Errorf("an expired signed URL: %d, want 401", code)
		}
		// Public and back.
		if out, code := d.cli("port", priv.ID, "8080", "--public"); code != 0 {
			t.Fatal(out)
		}
		if code, _ := get(toProxy, u.URL, nil); code != 200 {
			t.Errorf("made public: %d", code)
		}
		if _, err := c.SetPorts(ctx, priv.ID, api.PortAccess{Public: false}); err != nil {
			t.Fatal(err)
		}
		if code, _ := get(toProxy, u.URL, nil); code != 401 {
			t.Errorf("made private again: %d, want 401", code)
		}
	})

	t.Run("both serve through the proxy and cannot reach each other", func(t *testing.T) {
		tok, err := c.PortURL(ctx, priv.ID, 8080, 0)
		if err != nil {
			t.Fatal(err)
		}
		if code, body := get(toProxy, tok.URL, map[string]string{"Atoll-Access-Token": tok.Token}); code != 200 || !strings.Contains(body, priv.ID) {
			t.Errorf("private: %d %q", code, body)
		}
		if code, body := get(toProxy, pu.URL, nil); code != 200 || !strings.Contains(body, pub.ID) {
			t.Errorf("public: %d %q", code, body)
		}
		if out, code := sh(t, c, pub.ID, "curl -fsS --max-time 3 http://"+priv.Network.IPv4+":8080/ 2>&1"); code == 0 {
			t.Errorf("a sandbox reaches another: %s", out)
		}
	})

	t.Run("a stopped sandbox", func(t *testing.T) {
		sb := newSandbox(ctx, t, c, api.CreateSandboxRequest{Ports: &api.PortAccess{Public: true}})
		if _, err := c.StopSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		u, err := c.PortURL(ctx, sb.ID, 8080, 0)
		if err != nil {
			t.Fatal(err)
		}
		if code, body := get(toProxy, u.URL, nil); code != 503 || !strings.Contains(body, "stopped") {
			t.Errorf("stopped: %d %q, want 503", code, body)
		}
		c.DeleteSandbox(ctx, sb.ID)
		if code, _ := get(toProxy, u.URL, nil); code != 404 {
			t.Errorf("deleted: %d, want 404", code)
		}
	})

	t.Run("proxy traffic is activity", func(t *testing.T) {
		// Nothing listens in these sandboxes, so only the proxy's requests
		// (each a 502) keep the busy one up; the idle one is the positive
		// control that auto-stop acts.
		busy := newSandbox(ctx, t, c, api.CreateSandboxRequest{AutoStopSec: 2, Ports: &api.PortAccess{Public: true}})
		idle := newSandbox(ctx, t, c, api.CreateSandboxRequest{AutoStopSec: 2})
		u, _ := c.PortURL(ctx, busy.ID, 8080, 0)
		stop := time.Now().Add(7 * time.Second)
		for time.Now().Before(stop) {
			if code, _ := get(toProxy, u.URL, nil); code != 502 {
				t.Fatalf("busy sandbox: %d, want 502", code)
			}
			time.Sleep(500 * time.Millisecond)
		}
		// GetSandbox is itself activity: read the list instead.
		sbs := listSandboxes(ctx, t, c)
		states := map[string]string{}
		for _, sb := range sbs {
			states[sb.ID] = sb.State
		}
		if states[idle.ID] != api.StateStopped {
			t.Errorf("positive control: the idle sandbox is %s, want stopped", states[idle.ID])
		}
		if states[busy.ID] != api.StateRunning {
			t.Errorf("the sandbox used through the proxy is %s, want running", states[busy.ID])
		}
	})

	t.Run("measure", func(t *testing.T) {
		direct8080 := "http://" + pub.Network.IPv4 + ":8080/"
		lat := func(cl *http.Client, u string) (p50, p99 time.Duration) {
			var ds []time.Duration
			for i := 0; i < 400; i++ {
				t0 := time.Now()
				if code, _ := get(cl, u, nil); code != 200 {
					t.Fatalf("GET %s: %d", u, code)
				}
				ds = append(ds, time.Since(t0))
			}
			slices.Sort(ds)
			return ds[len(ds)/2], ds[len(ds)*99/100]
		}
		download := func(cl *http.Client, u string) float64 {
			t0 := time.Now()
			resp, err := cl.Get(u)
			if err != nil {
				t.Fatal(err)
			}
			n, _ := io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if n != 128<<20 {
				t.Fatalf("%s: %d bytes", u, n)
			}
			return float64(n) / (1 << 20) / time.Since(t0).Seconds()
		}
		// Interleaved, so that the shared machine's load falls on both.
		var dr, pr []float64
		for i := 0; i < 7; i++ {
			dr = append(dr, download(direct, direct8080+"big"))
			pr = append(pr, download(toProxy, pu.URL+"big"))
		}
		slices.Sort(dr)
		slices.Sort(pr)
		get(direct, direct8080, nil) // warm connections
		get(toProxy, pu.URL, nil)
		d50, d99 := lat(direct, direct8080)
		p50, p99 := lat(toProxy, pu.URL)
		t.Logf("small GET (python http.server, keep-alive, 400 sequential): direct p50 %v p99 %v; proxy p50 %v p99 %v",
			d50.Round(time.Microsecond), d99.Round(time.Microsecond), p50.Round(time.Microsecond), p99.Round(time.Microsecond))
		t.Logf("128 MiB download, 7 interleaved: direct median %.0f best %.0f MiB/s; proxy median %.0f best %.0f MiB/s",
			dr[3], dr[6], pr[3], pr[6])
	})
}

// TestPortsOfFreshSandboxes runs create → serve → reach → delete cycles on
// one server, in a row and concurrently, under each runtime with a network
// that runs here: each new sandbox gets a slot (so addresses) a deleted
// one had, and the first request through the port proxy, and the first
// connection from the host to its IPv6 address, must succeed within a
// second of its server listening. (The host's neighbour table once kept
// the previous sandbox's MAC for the address, and such requests waited 5
// to 22 s, answered 504.)
func TestPortsOfFreshSandboxes(t *testing.T) {
	w, d := startPortsDaemon(t)
	c := d.client()
	ctx := context.Background()
	var proxyAddr string
	// A new connection per request: each is a first one.
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			if strings.HasSuffix(strings.Split(addr, ":")[0], ".sb.test") {
				addr = proxyAddr
			}
			return w.dial(ctx, "tcp", addr)
		},
	}}
	within := func(u, want string) error {
		t0 := time.Now()
		resp, err := client.Get(u)
		if err != nil {
			return fmt.Errorf("GET %s: %w after %v", u, err, time.Since(t0).Round(time.Millisecond))
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || want != "" && string(b) != want {
			return fmt.Errorf("GET %s: %d %q after %v, want 200 %q", u, resp.StatusCode, b, time.Since(t0).Round(time.Millisecond), want)
		}
		return nil
	}
	// serve starts the server in sb; it listens when serve returns.
	serve := func(sb api.Sandbox) error {
		if _, err := c.WriteFile(ctx, sb.ID, "/tmp/listen.py", strings.NewReader(testenv.ListenScript("socket.gethostname().encode()")), 0o644); err != nil {
			return err
		}
		var out bytes.Buffer
		code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "/tmp/listen.py"}}, &out, &out)
		if err != nil || code != 0 {
			return fmt.Errorf("starting the server: %d %v %s", code, err, out.String())
		}
		return nil
	}
	// reach asks sb's server through the proxy and over IPv6; want is the
	// answer, "" for any.
	reach := func(sb api.Sandbox, want string) error {
		u, err := c.PortURL(ctx, sb.ID, 8080, 0)
		if err != nil {
			return err
		}
		if proxyAddr == "" {
			return errors.New("no proxy address")
		}
		if err := within(u.URL, want); err != nil {
			return fmt.Errorf("through the proxy: %w", err)
		}
		if err := within("http://"+net.JoinHostPort(sb.Network.IPv6, "8080")+"/", want); err != nil {
			return fmt.Errorf("from the host over IPv6: %w", err)
		}
		return nil
	}
	cycle := func(rt string) (slot string, err error) {
		sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Runtime: rt, MemoryMiB: 512, Ports: &api.PortAccess{Public: true}})
		if err != nil {
			return "", fmt.Errorf("create: %w", err)
		}
		defer c.DeleteSandbox(ctx, sb.ID)
		if err := serve(sb); err != nil {
			return sb.Network.IPv4, err
		}
		return sb.Network.IPv4, reach(sb, sb.ID)
	}
	// The proxy's address.
	first, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{Ports: &api.PortAccess{Public: true}})
	if err != nil {
		t.Fatalf("create: %v\n%s", err, d.out.String())
	}
	pu, err := c.PortURL(ctx, first.ID, 8080, 0)
	if err != nil {
		t.Fatal(err)
	}
	pURL, _ := url.Parse(pu.URL)
	proxyAddr = net.JoinHostPort("127.0.0.1", pURL.Port())
	if err := c.DeleteSandbox(ctx, first.ID); err != nil {
		t.Fatal(err)
	}

	// What each runtime needs here, and how many cycles it can afford.
	runtimes := []struct {
		name    string
		require func(*testing.T)
		n       int
	}{
		{"ns", func(*testing.T) {}, 6},
		{"gvisor", func(t *testing.T) { testenv.RequireCommand(t, "runsc") }, 6},
		{"vm", requireVM, 3},
	}
	for _, rt := range runtimes {
		t.Run(rt.name+" in a row", func(t *testing.T) {
			rt.require(t)
			seen := map[string]int{}
			for i := 0; i < rt.n; i++ {
				addr, err := cycle(rt.name)
				if err != nil {
					t.Fatalf("cycle %d (%s): %v", i, addr, err)
				}
				seen[addr]++
			}
			if len(seen) > rt.n/2 {
				t.Errorf("addresses %v: want the slots used again", seen)
			}
		})
		t.Run(rt.name+" concurrently", func(t *testing.T) {
			rt.require(t)
			workers, cycles := 3, rt.n/2
			errs := make(chan error, workers)
			for w := 0; w < workers; w++ {
				go func() {
					for i := 0; i < cycles; i++ {
						if addr, err := cycle(rt.name); err != nil {
							errs <- fmt.Errorf("worker %d cycle %d (%s): %w", w, i, addr, err)
							return
						}
					}
					errs <- nil
				}()
			}
			for w := 0; w < workers; w++ {
				if err := <-errs; err != nil {
					t.Error(err)
				}
			}
		})
	}
	// The children of a memory fork run on the parent's server, with the
	// parent's MAC as the guest saved it unless they get their slots'; each
	// is asked twice, after its siblings, so that a MAC shared by several
	// bridge ports would send the host's packets to the wrong one.
	for _, rt := range runtimes[1:] {
		t.Run(rt.name+" memory fork", func(t *testing.T) {
			rt.require(t)
			parent := newSandbox(ctx, t, c, api.CreateSandboxRequest{Runtime: rt.name, MemoryMiB: 512, Ports: &api.PortAccess{Public: true}})
			defer c.DeleteSandbox(ctx, parent.ID)
			if err := serve(parent); err != nil {
				t.Fatal(err)
			}
			if err := reach(parent, parent.ID); err != nil {
				t.Fatalf("parent: %v", err)
			}
			children, err := c.ForkSandbox(ctx, parent.ID, api.ForkRequest{Count: 2, Memory: true})
			if err != nil {
				t.Fatal(err)
			}
			for _, ch := range children {
				defer c.DeleteSandbox(ctx, ch.ID)
			}
			parent, err = c.GetSandbox(ctx, parent.ID)
			if err != nil {
				t.Fatal(err)
			}
			// Any answer: whether a child's server sees its own hostname
			// is the runtime's business, not this test's.
			all := append([]api.Sandbox{parent}, children...)
			for round := 0; round < 2; round++ {
				for _, sb := range all {
					if err := reach(sb, ""); err != nil {
						t.Errorf("round %d, %s (parent %v): %v", round, sb.ID, sb.ID == parent.ID, err)
					}
				}
			}
		})
	}
}
