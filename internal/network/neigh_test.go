package network

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/atoll-dev/atoll/internal/egress"
	"github.com/atoll-dev/atoll/internal/netns"
)

// eth0MAC is the MAC of the sandbox's link in the namespace at path.
func eth0MAC(path string) (mac string, err error) {
	err = netns.Run(path, func() error {
		l, err := netlink.LinkByName(sandboxLink)
		if err == nil {
			mac = l.Attrs().HardwareAddr.String()
		}
		return err
	})
	return mac, err
}

// TestReusedSlotAnswersAtOnce attaches, serves, reaches and releases slots
// over and over, cold and from the pool, in a row and concurrently: a slot
// attached again answers the host's first connection, over IPv4 and IPv6,
// at once, though the host talked to the slot's previous sandbox, and its
// MAC is the slot's every time.
func TestReusedSlotAnswersAtOnce(t *testing.T) {
	tp := newTopology(t, Config{})
	m := tp.m
	ctx := context.Background()
	pool := warmPool(t, m, 2)

	var macsMu sync.Mutex
	macs := map[int]string{} // slot's MAC in its first cycle
	cycle := func(slot, i int) error {
		var a *Attachment
		var err error
		if i%2 == 0 {
			a, err = pool.Get(ctx, slot, egress.Policy{})
		} else {
			a, err = m.Attach(ctx, slot, egress.Policy{})
		}
		if err != nil {
			return fmt.Errorf("attach: %w", err)
		}
		defer m.Release(ctx, slot)
		var ln net.Listener
		if err := netns.Run(a.Netns, func() (err error) { ln, err = net.Listen("tcp", "[::]:8080"); return err }); err != nil {
			return err
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "slot %d cycle %d", slot, i)
		})}
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { defer wg.Done(); srv.Serve(ln) }()
		defer func() { srv.Close(); wg.Wait() }()
		want := fmt.Sprintf("slot %d cycle %d", slot, i)
		for _, addr := range []string{a.Addr4.Addr().String(), a.Addr6.Addr().String()} {
			// A second: the kernel's retries of a lost SYN, ARP or neighbour
			// solicitation come after one.
			t0 := time.Now()
			body, err := getWithin(tp.host, url(addr, 8080), time.Second)
			if err != nil || body != want {
				return fmt.Errorf("host to %s: %q %v after %v", addr, body, err, time.Since(t0).Round(time.Millisecond))
			}
		}
		mac, err := eth0MAC(a.Netns)
		if err != nil {
			return err
		}
		macsMu.Lock()
		first, seen := macs[slot]
		if !seen {
			macs[slot] = mac
		}
		macsMu.Unlock()
		if seen && mac != first {
			return fmt.Errorf("eth0's MAC is %s, was %s in the slot's first cycle", mac, first)
		}
		return nil
	}

	t.Run("in a row", func(t *testing.T) {
		for i := 0; i < 6; i++ {
			if err := cycle(3, i); err != nil {
				t.Fatalf("cycle %d: %v", i, err)
			}
		}
	})
	t.Run("concurrently", func(t *testing.T) {
		errs := make(chan error, 12)
		for w := 0; w < 3; w++ {
			go func() {
				for i := 0; i < 4; i++ {
					if err := cycle(4+w, i+w); err != nil {
						errs <- fmt.Errorf("slot %d cycle %d: %w", 4+w, i, err)
						return
					}
				}
				errs <- nil
			}()
		}
		for w := 0; w < 3; w++ {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	})
	if c := takeCensus(t, tp, 3, 4, 5, 6); c != (census{}) {
		t.Errorf("after release: %+v", c)
	}
}

// TestCarrierPort: the bridge keeps its carrier with no sandbox attached, a
// restarted Manager adopts the carrier port, and Teardown removes it.
func TestCarrierPort(t *testing.T) {
	tp := newTopology(t, Config{})
	m := tp.m
	bridgeUp := func() bool {
		br, err := tp.hostHandle.LinkByName(m.cfg.Bridge)
		if err != nil {
			t.Fatal(err)
		}
		return br.Attrs().OperState == netlink.OperUp
	}
	if !bridgeUp() {
		t.Error("the bridge has no carrier without sandboxes")
	}
	if _, err := m.Attach(context.Background(), 1, egress.Policy{}); err != nil {
		t.Fatal(err)
	}
	if err := m.Release(context.Background(), 1); err != nil {
		t.Fatal(err)
	}
	m2, err := New(m.cfg)
	if err != nil {
		t.Fatalf("New over a carrier port: %v", err)
	}
	defer m2.Close()
	if !bridgeUp() {
		t.Error("the bridge lost its carrier")
	}
	if err := m2.Teardown(context.Background()); err != nil {
		t.Fatal(err)
	}
	port, peer := m.cfg.carrierNames()
	for _, name := range []string{port, peer} {
		if _, err := tp.hostHandle.LinkByName(name); err == nil {
			t.Errorf("%s left after Teardown", name)
		}
	}
	// Again, for the topology's own Teardown.
	m3, err := New(m.cfg)
	if err != nil {
		t.Fatal(err)
	}
	m3.Close()
}

// TestMACPinned: frames a sandbox sends from another slot's MAC (a VM's
// guest, root of its kernel, can) go nowhere, so the bridge does not learn
// that MAC behind its port and the host still reaches the other sandbox.
func TestMACPinned(t *testing.T) {
	tp := newTopology(t, Config{})
	m := tp.m
	ctx := context.Background()
	victim, err := m.Attach(ctx, 1, egress.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(ctx, 1)
	thief, err := m.Attach(ctx, 2, egress.Policy{})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Release(ctx, 2)
	serveHTTP(t, victim.Netns, "victim", "[::]:8080")
	u := url(victim.Addr4.Addr().String(), 8080)
	if _, err := getWithin(tp.host, u, time.Second); err != nil {
		t.Fatalf("positive control, host to the victim: %v", err)
	}
	err = netns.Run(thief.Netns, func() error {
		l, err := netlink.LinkByName(sandboxLink)
		if err != nil {
			return err
		}
		return netlink.LinkSetHardwareAddr(l, slotMAC(m.cfg.Bridge, 1))
	})
	if err != nil {
		t.Fatal(err)
	}
	// Frames from the stolen MAC: ARP for the gateway and what follows.
	udpEcho(thief.Netns, hostport(thief.Gateway4.String(), 53))
	udpEcho(thief.Netns, hostport(thief.Gateway6.String(), 53))
	if _, err := getWithin(tp.host, u, time.Second); err != nil {
		t.Errorf("host to the victim after another sandbox sent from its MAC: %v", err)
	}
}
