package network

import (
	"errors"
	"fmt"
	"path/filepath"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/atoll-dev/atoll/internal/egress"
)

// A sandbox's bandwidth caps are token bucket filters (tbf) at the root of
// the two ends of its veth, each shaping what leaves through its end: the
// sandbox's eth0 shapes what the sandbox sends, the host end what it
// receives. Both ends shape rather than police (drop at a rate), so TCP
// settles at the cap instead of sawing. The sandbox's end is in a
// namespace the host owns: root in the sandbox cannot lift it.

// rates are a slot's caps in bytes per second, egress then ingress.
type rates [2]uint64

func ratesOf(p egress.Policy) rates { return rates{p.EgressRate, p.IngressRate} }

// tbf is the shaper for rate bytes per second on link: a bucket of 20 ms
// (at least 64 KiB, so that a full GSO packet passes whole; at most 16 MiB)
// and a queue of 50 ms on top of it, beyond which packets are dropped.
func tbf(link int, rate uint64) *netlink.Tbf {
	burst := min(max(rate/50, 64<<10), 16<<20)
	limit := min(rate/20+burst, 1<<31)
	return &netlink.Tbf{
		QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT},
		Rate:       rate,
		Limit:      uint32(limit),
		Buffer:     netlink.Xmittime(rate, uint32(burst)),
	}
}

// shapeLink gives link a tbf for rate, or its default queueing back when
// rate is 0.
func shapeLink(h *netlink.Handle, link int, rate uint64) error {
	if rate != 0 {
		return h.QdiscReplace(tbf(link, rate))
	}
	err := h.QdiscDel(&netlink.Tbf{QdiscAttrs: netlink.QdiscAttrs{LinkIndex: link, Handle: netlink.MakeHandle(1, 0), Parent: netlink.HANDLE_ROOT}})
	if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.EINVAL) {
		return nil // the default: nothing to remove
	}
	return err
}

// shape sets slot's caps to r. ns is a handle in the slot's namespace, or
// nil to open one.
func (m *Manager) shape(slot int, ns *netlink.Handle, r rates) error {
	name := m.cfg.slotName(slot)
	if ns == nil {
		fd, err := unix.Open(filepath.Join(m.cfg.NetnsDir, name), unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("opening network namespace of slot %d: %w", slot, err)
		}
		ns, err = netlink.NewHandleAt(netns.NsHandle(fd))
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("opening netlink in slot %d: %w", slot, err)
		}
		defer ns.Close()
	}
	eth0, err := ns.LinkByName(sandboxLink)
	if err != nil {
		return fmt.Errorf("finding the sandbox link of slot %d: %w", slot, err)
	}
	if err := shapeLink(ns, eth0.Attrs().Index, r[0]); err != nil {
		return fmt.Errorf("setting egress bandwidth of slot %d: %w", slot, err)
	}
	host, err := m.nl.LinkByName(name)
	if err != nil {
		return fmt.Errorf("finding veth of slot %d: %w", slot, err)
	}
	if err := shapeLink(m.nl, host.Attrs().Index, r[1]); err != nil {
		return fmt.Errorf("setting ingress bandwidth of slot %d: %w", slot, err)
	}
	return nil
}
