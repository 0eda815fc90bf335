package control

import (
	"sort"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/runtime"
)

// Runtimes lists the runtimes this node offers, with their capabilities,
// and those it knows but cannot offer, with why.
func (s *Service) Runtimes() []api.Runtime {
	out := []api.Runtime{}
	for name, rt := range s.runtimes {
		c := runtime.CapsOf(rt)
		out = append(out, api.Runtime{Name: name, Available: true, Default: name == s.defaults.Runtime,
			Capabilities: api.RuntimeCapabilities{
				Pause: c.Pause, MemorySnapshot: c.MemorySnapshot && s.checkpoints != "", MemoryFork: c.MemoryFork,
				ProcessOOM: c.ProcessOOM, SharedKernel: c.SharedKernel, Network: c.Network && s.net != nil,
				Emulated: c.Emulated,
			}})
	}
	for name, why := range s.unavailable {
		if s.runtimes[name] == nil {
			out = append(out, api.Runtime{Name: name, Reason: why})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}
