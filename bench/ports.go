package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/testenv"
)

// ports measures, on a server with networking that has already run
// sandboxes (so each new one takes up a slot, and addresses, the host has
// talked to), the time from a fresh sandbox's server listening to the first
// 200 through the port proxy and from the host to its IPv6 address, and,
// as the peer, a second request through the proxy. The server runs in a
// network namespace of its own, which it treats as the host, so that the
// machine's own network is left alone.
func ports(r *report, work string, n int) {
	srv, client, proxyAddr, done := proxiedServer(work, "ports")
	defer done()
	c := srv.client()
	ctx := context.Background()
	// firstOK is the time until a GET of u answers 200, asking again (as
	// the user did, every 0.1 s) after each failure, such as the
	// proxy's 504 after 5 s.
	firstOK := func(u string) time.Duration {
		t0 := time.Now()
		for time.Since(t0) < time.Minute {
			resp, err := client.Get(u)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return time.Since(t0)
				}
			}
			time.Sleep(100 * time.Millisecond)
		}
		fatal("%s never answered 200", u)
		return 0
	}
	var proxied, direct6, again []time.Duration
	for i := 0; i < n+1; i++ {
		sb, u := listening(srv, api.CreateSandboxRequest{Ports: &api.PortAccess{Public: true}}, proxyAddr)
		p := firstOK(u)
		d6 := firstOK("http://" + net.JoinHostPort(sb.Network.IPv6, "8080") + "/")
		t0 := time.Now()
		firstOK(u)
		a := time.Since(t0)
		check(c.DeleteSandbox(ctx, sb.ID))
		if i == 0 {
			continue // the server's first sandbox: its slot was new
		}
		proxied, direct6, again = append(proxied, p), append(direct6, d6), append(again, a)
	}
	r.add("listen → first 200 through the port proxy, fresh sandbox on a used slot", "sequential", proxied)
	r.add("listen → first 200 from the host to its IPv6 address", "sequential", direct6)
	r.add("a second request through the port proxy (peer: nothing new)", "sequential", again)
	srv.stop()
	if left, _ := filepath.Glob("/run/netns/atollb*"); len(left) > 0 {
		r.failed("ports", fmt.Sprintf("namespaces left after the server stopped: %v", left))
	}
}

// listening creates a sandbox by req on srv, with a server listening on
// its port 8080 (testenv.ListenScript), and returns it and the port's URL through
// the port proxy, whose address it sets in *proxyAddr.
func listening(srv *server, req api.CreateSandboxRequest, proxyAddr *string) (api.Sandbox, string) {
	ctx := context.Background()
	c := srv.client()
	sb, err := c.CreateSandbox(ctx, req)
	check(err)
	_, err = c.WriteFile(ctx, sb.ID, "/tmp/listen.py", strings.NewReader(testenv.ListenScript(`b"ok"`)), 0o644)
	check(err)
	var out bytes.Buffer
	if code, err := c.Exec(ctx, sb.ID, api.ExecRequest{Cmd: []string{"python3", "/tmp/listen.py"}}, &out, &out); err != nil || code != 0 {
		fatal("starting a server in a sandbox: %d %v %s", code, err, out.String())
	}
	u, err := c.PortURL(ctx, sb.ID, 8080, 0)
	check(err)
	pu, err := url.Parse(u.URL)
	check(err)
	*proxyAddr = net.JoinHostPort("127.0.0.1", pu.Port())
	return sb, u.URL
}

// proxiedServer starts a server named name with networking and its port
// proxy in a network namespace of its own, which it treats as the host, so
// that the machine's own network is left alone; client reaches the proxy
// (for any *.sb.test host, at the address *proxyAddr is set to) and the
// sandboxes from that namespace, one new connection per request. done
// removes the namespace.
func proxiedServer(work, name string) (srv *server, client *http.Client, proxyAddr *string, done func()) {
	ns := "atoll-bench-" + name
	nsPath := filepath.Join("/run/netns", ns)
	exec.Command("ip", "netns", "del", ns).Run()
	must("ip", "netns", "add", ns)
	must("ip", "-n", ns, "link", "set", "lo", "up")
	srv = startServerIn(work, name, nsPath, "--network", "on", "--network-bridge", "atollb",
		"--dns-upstream", "127.0.0.1", "--warm-pool", "1", "--prestart", "0", "--network-pool", "1",
		"--proxy-listen", "127.0.0.1:0", "--proxy-domain", "sb.test")
	proxyAddr = new(string)
	client = &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, // every request a first connection
		DialContext: func(ctx context.Context, netw, addr string) (net.Conn, error) {
			if strings.HasSuffix(strings.Split(addr, ":")[0], ".sb.test") {
				addr = *proxyAddr
			}
			return srv.dial(ctx, netw, addr)
		},
	}}
	return srv, client, proxyAddr, func() { exec.Command("ip", "netns", "del", ns).Run() }
}
