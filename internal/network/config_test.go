package network

import (
	"errors"
	"net/netip"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

func TestConfigDefaults(t *testing.T) {
	c, err := Config{}.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Bridge != "atoll0" || c.Subnet4.String() != "10.213.0.0/16" || c.Table != "atoll" || c.NetnsDir != "/run/netns" {
		t.Errorf("defaults: %+v", c)
	}
	if !c.Subnet6.Addr().IsPrivate() || c.Subnet6.Bits() != 64 || c.Subnet6.Addr().As16()[0] != 0xfd {
		t.Errorf("default IPv6 subnet %s is not a ULA /64", c.Subnet6)
	}
	other, _ := Config{Bridge: "atoll1"}.withDefaults()
	if other.Subnet6 == c.Subnet6 {
		t.Errorf("bridges atoll0 and atoll1 share IPv6 subnet %s", c.Subnet6)
	}
	if other.Table != "atoll-atoll1" {
		t.Errorf("bridge atoll1's table is %q, want atoll-atoll1: servers sharing a namespace would rewrite each other's", other.Table)
	}
	if _, err := (Config{Deny: []netip.Prefix{{}}}).withDefaults(); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("an invalid denied prefix: %v, want ErrInvalid", err)
	}
	again, _ := Config{}.withDefaults()
	if again.Subnet6 != c.Subnet6 {
		t.Errorf("default IPv6 subnet changed between calls: %s, %s", c.Subnet6, again.Subnet6)
	}
	if diff := cmp.Diff([]uint16{53}, c.GatewayTCPPorts); diff != "" {
		t.Errorf("gateway TCP ports: %s", diff)
	}
	if c.capacity() != 65533 {
		t.Errorf("capacity of a /16: %d", c.capacity())
	}
}

func TestConfigRejectsBadInput(t *testing.T) {
	for _, c := range []Config{
		{Bridge: "../etc"},
		{Bridge: "atoll0-1"},
		{Bridge: "Atoll"},
		{Bridge: "0atoll"},
		{Bridge: "atollatoll"}, // 10 bytes: "<bridge>-<slot>" would not fit
		{Bridge: "atoll\x00"},
		{Subnet4: netip.MustParsePrefix("10.0.0.0/30")},
		{Subnet4: netip.MustParsePrefix("10.0.0.0/7")},
		{Subnet4: netip.MustParsePrefix("fd00::/64")},
		{Subnet6: netip.MustParsePrefix("10.0.0.0/16")},
		{Subnet6: netip.MustParsePrefix("fd00::/96")},
		{Subnet6: netip.MustParsePrefix("::ffff:10.0.0.0/104")},
		{MTU: 1000},
		{MTU: 70000},
		{GatewayTCPPorts: []uint16{0}},
		{Allow: []netip.Prefix{{}}},
	} {
		if _, err := c.withDefaults(); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%+v: got %v, want ErrInvalid", c, err)
		}
	}
}

func TestSlotAddresses(t *testing.T) {
	c, _ := Config{
		Subnet4: netip.MustParsePrefix("10.213.0.0/16"),
		Subnet6: netip.MustParsePrefix("fd12:3456:789a::/64"),
	}.withDefaults()
	for _, tc := range []struct {
		slot   int
		v4, v6 string
	}{
		{0, "10.213.0.2/16", "fd12:3456:789a::2/64"},
		{253, "10.213.0.255/16", "fd12:3456:789a::ff/64"},
		{254, "10.213.1.0/16", "fd12:3456:789a::100/64"},
		{65532, "10.213.255.254/16", "fd12:3456:789a::fffe/64"},
	} {
		a4, a6 := c.slotAddrs(tc.slot)
		if a4.String() != tc.v4 || a6.String() != tc.v6 {
			t.Errorf("slot %d: %s %s, want %s %s", tc.slot, a4, a6, tc.v4, tc.v6)
		}
		for _, a := range []netip.Addr{a4.Addr(), a6.Addr()} {
			if s, ok := c.slotOf(a); !ok || s != tc.slot {
				t.Errorf("slotOf(%s) = %d, %v; want %d", a, s, ok, tc.slot)
			}
		}
		if err := c.checkSlot(tc.slot); err != nil {
			t.Errorf("checkSlot(%d): %v", tc.slot, err)
		}
	}
	if c.gateway4().String() != "10.213.0.1" || c.gateway6().String() != "fd12:3456:789a::1" {
		t.Errorf("gateways %s %s", c.gateway4(), c.gateway6())
	}
	for _, slot := range []int{-1, 65533, 1 << 40} {
		if err := c.checkSlot(slot); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("checkSlot(%d): %v, want ErrInvalid", slot, err)
		}
	}
	for _, a := range []string{"10.213.0.0", "10.213.0.1", "10.213.255.255", "10.214.0.2", "fd12:3456:789a::1", "fd12:3456:789a:0:1::2", "8.8.8.8"} {
		if s, ok := c.slotOf(netip.MustParseAddr(a)); ok {
			t.Errorf("slotOf(%s) = %d, want none", a, s)
		}
	}
	small, _ := Config{Subnet4: netip.MustParsePrefix("192.168.5.0/24")}.withDefaults()
	if small.capacity() != 253 {
		t.Errorf("capacity of a /24: %d", small.capacity())
	}
}

func TestNames(t *testing.T) {
	c, _ := Config{}.withDefaults()
	if c.slotName(17) != "atoll0-17" || c.warmName(3) != "atoll0w3" {
		t.Errorf("names %s %s", c.slotName(17), c.warmName(3))
	}
	if n := c.slotName(maxSlots - 1); len(n) > 15 {
		t.Errorf("%s is longer than IFNAMSIZ allows", n)
	}
	for name, want := range map[string]int{"atoll0-0": 0, "atoll0-17": 17, "atoll0-99999": 99999} {
		if s, ok := c.parseSlotName(name); !ok || s != want {
			t.Errorf("parseSlotName(%s) = %d, %v", name, s, ok)
		}
	}
	for _, name := range []string{"atoll0-", "atoll0-01", "atoll0--1", "atoll0-100000", "atoll0-1a", "atoll1-1", "atoll0w1", "xatoll0-1"} {
		if s, ok := c.parseSlotName(name); ok {
			t.Errorf("parseSlotName(%s) = %d, want none", name, s)
		}
	}
	if !c.isWarmName("atoll0w12") || c.isWarmName("atoll0-12") || c.isWarmName("atoll0w") {
		t.Error("isWarmName")
	}
	long, _ := Config{Bridge: "abcdefghi"}.withDefaults()
	for _, cfg := range []Config{c, long} {
		port, peer := cfg.carrierNames()
		for _, n := range []string{port, peer} {
			if _, ok := cfg.parseSlotName(n); ok || cfg.isWarmName(n) || len(n) > 15 || n == cfg.Bridge {
				t.Errorf("carrier name %s: a slot's or warm entry's, the bridge's, or too long", n)
			}
		}
	}
}

// TestSlotMAC: every slot has its own unicast, locally administered MAC,
// never the bridge's, the same for the same bridge and slot.
func TestSlotMAC(t *testing.T) {
	for _, bridge := range []string{"atoll0", "t1a2b3c", "abcdefghi"} {
		seen := map[string]int{bridgeMAC(bridge).String(): -1}
		for slot := 0; slot < maxSlots; slot++ {
			mac := slotMAC(bridge, slot)
			if mac[0]&1 != 0 || mac[0]&2 == 0 {
				t.Fatalf("%s slot %d: %s is not a locally administered unicast address", bridge, slot, mac)
			}
			if other, dup := seen[mac.String()]; dup {
				t.Fatalf("%s: slots %d and %d share %s (-1 is the bridge)", bridge, slot, other, mac)
			}
			seen[mac.String()] = slot
		}
		if slotMAC(bridge, 7).String() != slotMAC(bridge, 7).String() {
			t.Errorf("%s: slot 7's MAC changes", bridge)
		}
	}
	if slotMAC("atoll0", 1).String() == slotMAC("atoll1", 1).String() {
		t.Error("two bridges give slot 1 one MAC")
	}
}

func TestIntervalElems(t *testing.T) {
	p := func(ss ...string) []netip.Prefix {
		var out []netip.Prefix
		for _, s := range ss {
			out = append(out, netip.MustParsePrefix(s))
		}
		return out
	}
	type el struct {
		key string
		end bool
	}
	got := func(ps []netip.Prefix) []el {
		var out []el
		for _, e := range intervalElems(ps) {
			a, _ := netip.AddrFromSlice(e.Key)
			out = append(out, el{a.String(), e.IntervalEnd})
		}
		return out
	}
	for _, tc := range []struct {
		in   []netip.Prefix
		want []el
	}{
		{p("10.0.0.0/8"), []el{{"10.0.0.0", false}, {"11.0.0.0", true}}},
		// Overlapping and adjacent prefixes merge; order does not matter.
		{p("10.1.0.0/16", "10.0.0.0/8", "11.0.0.0/8"), []el{{"10.0.0.0", false}, {"12.0.0.0", true}}},
		// A range that reaches the top has no end element.
		{p("224.0.0.0/3", "0.0.0.0/8"), []el{{"0.0.0.0", false}, {"1.0.0.0", true}, {"224.0.0.0", false}}},
		{p("ff00::/8", "fe80::/10"), []el{{"fe80::", false}, {"fec0::", true}, {"ff00::", false}}},
		{p("0.0.0.0/0"), []el{{"0.0.0.0", false}}},
		{nil, nil},
	} {
		if diff := cmp.Diff(tc.want, got(tc.in), cmp.AllowUnexported(el{})); diff != "" {
			t.Errorf("%v: %s", tc.in, diff)
		}
	}
	for _, p := range BlockedPrefixes {
		if !p.IsValid() || p != p.Masked() {
			t.Errorf("blocked prefix %s is not a masked prefix", p)
		}
	}
}
