// Package network gives each sandbox its own network namespace on a host
// bridge and holds the firewall that keeps sandboxes apart from each other,
// from the host and from private networks, and that enforces each sandbox's
// egress policy (package egress) with a resolver and an egress proxy on the
// gateway.
//
// # Model
//
// A Manager owns one bridge (default atoll0) with the gateway addresses of
// an IPv4 subnet (default 10.213.0.0/16) and an IPv6 /64 (default a unique
// local prefix derived from the bridge name), and one nftables table (inet
// "atoll"). Each sandbox has a slot, the integer the control plane already
// gives it; the slot alone decides its addresses (slot n gets the (n+2)th
// address of each subnet; the gateway is the first) and its names: the
// namespace /run/netns/atoll0-n and the host veth atoll0-n. Nothing is
// stored: after a daemon restart, New and Lookup find it all again, and
// Sweep removes what belongs to no live slot.
//
// The namespace is made by the Manager, so it is owned by the initial user
// namespace. The sandbox process joins it (netns.Run) and then makes its own
// user namespace; being root there gives it no power over the network
// namespace: it cannot change its addresses, routes or firewall, open raw
// or packet sockets, or send router advertisements. The Manager sets
// ip_unprivileged_port_start=0 and ping_group_range inside so that it can
// still bind low ports and ping.
//
// Inside, the sandbox has lo and eth0 with its two addresses, default routes
// via the gateways and the bridge's MTU (default the uplink's). The
// resolver and the egress proxy listen on the gateway addresses (Listen,
// Run).
//
// # Egress policies
//
// Each attached slot has a chain of its own, s<slot>, that the verdict maps
// send its new connections to, and six sets: denied, allowed and resolved
// destinations of each family. The chain refuses the denied; lets through,
// to the shared egress checks, slots in the open sets (allow-all), the
// allowed prefixes and the resolved addresses; and refuses the rest. A
// policy change refills the sets in one batch (atomic for new connections)
// and deletes the conntrack entries of the slot's connections the new
// policy forbids, so that their next packet is judged anew and refused.
//
// The resolver knows a sandbox by its source address. It forwards a
// question to the upstream servers only if the policy allows the name (all
// names under allow-all), answers NXDOMAIN otherwise, and puts the
// addresses of an allowed name's answer into the slot's resolved sets, with
// a timeout of the answer's TTL (at least a minute) plus a grace period,
// before it answers. For slots whose policy allows names, prerouting sends
// TCP to ports 80 and 443 to the egress proxy on the gateway, which reads
// the TLS ClientHello's server name or each HTTP request's Host and connects
// to the original destination only if the name is allowed and resolves to
// it; destinations allowed by address pass through unread. So an address
// that an allowed name shares with a denied one (a CDN's) cannot front the
// denied name. Encrypted ClientHellos, which hide the name, are refused.
//
// The kernel keeps a slot's sets across a daemon restart: New reads them
// back and installs them again, and SetPolicy later tells the resolver and
// the proxy the policy again.
//
// Manager.Attach makes all this for a slot from nothing; a Pool keeps
// namespaces with their veths made ahead of time, so that Pool.Get only
// renames one, adds addresses and routes, and inserts the firewall elements.
// Release undoes either, and Sweep, given the slots still in use, removes
// whatever a crash left behind.
//
// # Guarantees
//
// These hold for IPv4 and IPv6 alike, from the moment Attach or Pool.Get
// returns until Release:
//
//   - A sandbox cannot reach another: its bridge port is isolated
//     (IFLA_BRPORT_ISOLATED), and traffic routed back into the bridge is
//     refused.
//   - A sandbox reaches the host only on the gateway addresses and ports of
//     Config.GatewayTCPPorts and GatewayUDPPorts (default 53), plus ping and
//     neighbour discovery; the rest of the host, the API port included, is
//     refused. Router solicitations, advertisements and redirects from
//     sandboxes are dropped, and the bridge does not accept them
//     (accept_ra=0).
//   - A sandbox cannot reach BlockedPrefixes (RFC 1918, 100.64.0.0/10,
//     link-local and metadata addresses such as 169.254.169.254 and
//     fd00:ec2::254, fc00::/7, loopback, multicast, IPv4-mapped and NAT64
//     forms) unless the operator lists them in Config.Allow. Refused TCP
//     gets a reset, other protocols ICMP "administratively prohibited".
//   - Everything else is reached through NAT (masquerade) on the host's
//     other interfaces. Nothing reaches a sandbox from outside but replies;
//     the host itself (the port proxy) can connect to sandboxes.
//   - Only the addresses of attached sandboxes are forwarded: the per-sandbox
//     state is one element per address in a verdict map, so attaching is a
//     set insert, never a ruleset rebuild.
//   - A sandbox's new connections follow its egress policy: denied
//     prefixes are refused; under deny-all only allowed prefixes and the
//     addresses its resolver gave it for allowed names are reached, and
//     names not allowed do not resolve. Changing the policy cuts the
//     connections the new one forbids.
//   - Release leaves nothing: no element, chain, set, veth, conntrack entry
//     or namespace.
//   - Probe checks that the kernel can enforce all this, and New refuses to
//     start when it cannot.
//
// The table's base chains match only traffic into or out of the bridge and
// accept everything else, so the host's own networking is left as it was.
// New does enable IPv4 and IPv6 forwarding (keeping router advertisements
// working on interfaces that took them, by moving accept_ra from 1 to 2);
// another firewall on the host that drops forwarded traffic must let the
// bridge's through. A Linux bridge has at most 1023 ports, which bounds the
// sandboxes with a network (warm pool entries included) on one bridge.
//
// # Joining the namespace
//
// A runtime that starts the sandbox with exec.Cmd drops CLONE_NEWNET from
// SysProcAttr.Cloneflags and starts the command inside netns.Run:
//
//	err := netns.Run(att.Netns, func() error { return cmd.Start() })
//
// The child is forked from a thread that is in the namespace, so it is born
// in it, and CLONE_NEWUSER then gives it a user namespace that does not own
// it. Joining later, from inside the child, is not possible: setns needs
// CAP_SYS_ADMIN over the namespace's owner, which the sandbox lacks.
package network
