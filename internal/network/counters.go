package network

import (
	"fmt"

	"github.com/atoll-dev/atoll/internal/errdefs"
)

// Counters are the bytes slot's sandbox received (in) and sent (out) since
// its network was attached, as the kernel counts them on the host end of
// its veth: everything the sandbox exchanges passes there, whether the
// firewall forwards it, the egress proxy or resolver on the gateway answers
// it, or a published port brings it. They start again from zero when the
// slot is attached again. A slot that is not attached is ErrNotFound.
func (m *Manager) Counters(slot int) (in, out int64, err error) {
	if err := m.cfg.checkSlot(slot); err != nil {
		return 0, 0, err
	}
	l, err := m.nl.LinkByName(m.cfg.slotName(slot))
	if err != nil {
		return 0, 0, fmt.Errorf("%w: network of slot %d: %v", errdefs.ErrNotFound, slot, err)
	}
	st := l.Attrs().Statistics
	if st == nil {
		return 0, 0, fmt.Errorf("network of slot %d has no counters", slot)
	}
	// The host end transmits what the sandbox receives, and the reverse.
	return int64(st.TxBytes), int64(st.RxBytes), nil
}
