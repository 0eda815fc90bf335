package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// policyFlags are the egress policy flags of create and network.
type policyFlags struct {
	egress                  string
	allow, deny             []string
	egressMbit, ingressMbit float64
}

func (p *policyFlags) register(f *pflag.FlagSet) {
	f.StringVar(&p.egress, "egress", "", `default egress: allow-all or deny-all (deny-all when --allow is given)`)
	f.StringArrayVar(&p.allow, "allow", nil, "under deny-all, allow an IP, CIDR, domain name or *.domain (repeatable)")
	f.StringArrayVar(&p.deny, "deny", nil, "refuse an IP or CIDR even if allowed (repeatable)")
	f.Float64Var(&p.egressMbit, "egress-mbit", 0, "cap what the sandbox sends, in Mbit/s (0: no cap)")
	f.Float64Var(&p.ingressMbit, "ingress-mbit", 0, "cap what the sandbox receives, in Mbit/s (0: no cap)")
}

// policy is the policy the flags give, or nil if none was given.
func (p *policyFlags) policy() *api.NetworkPolicy {
	if p.egress == "" && len(p.allow) == 0 && len(p.deny) == 0 && p.egressMbit == 0 && p.ingressMbit == 0 {
		return nil
	}
	out := &api.NetworkPolicy{Egress: p.egress, Allow: p.allow, Deny: p.deny}
	if p.egressMbit != 0 || p.ingressMbit != 0 {
		out.Bandwidth = &api.Bandwidth{EgressMbit: p.egressMbit, IngressMbit: p.ingressMbit}
	}
	return out
}

func newNetworkCmd(g *globals) *cobra.Command {
	var pol policyFlags
	cmd := showCmd(g, &cobra.Command{
		Use:   "network ID [--egress allow-all|deny-all] [--allow X]... [--deny X]... [--egress-mbit N] [--ingress-mbit N]",
		Short: "Show or change a sandbox's network and egress policy",
		Long: `Show a sandbox's addresses and egress policy, or, with --egress, --allow or
--deny, replace its policy (the flags give the whole new policy).

Under deny-all the sandbox reaches only what --allow lists: IP addresses, CIDR
prefixes and domain names, "*.example.com" for every name below example.com.
A name's addresses open once the sandbox has resolved it through its resolver;
names not listed do not resolve; on ports 80 and 443 the HTTP Host and TLS
server name must be a listed name. --deny refuses addresses and prefixes either
way. --egress-mbit and --ingress-mbit cap the rates at which the sandbox
sends and receives (everything: the internet, its resolver, its ports through
the port proxy). A running sandbox gets the new policy at once, and its
connections the policy forbids are cut; a stopped one at its next start.
Private and metadata addresses stay blocked whatever the policy, unless the
server allows them.`,
		Example: `  atoll network 3k9x2m7q1w8e5r4t6y0u
  atoll network 3k9x2m7q1w8e5r4t6y0u --egress deny-all --allow github.com --allow '*.githubusercontent.com'
  atoll network 3k9x2m7q1w8e5r4t6y0u --deny 203.0.113.0/24
  atoll network 3k9x2m7q1w8e5r4t6y0u --egress allow-all --ingress-mbit 100 --egress-mbit 20`,
		Args: cobra.ExactArgs(1),
	}, "print JSON", func(ctx context.Context, c *atoll.Client, args []string) (api.SandboxNetwork, error) {
		if p := pol.policy(); p != nil {
			return c.SetNetwork(ctx, args[0], *p)
		}
		return c.GetNetwork(ctx, args[0])
	}, renderNetwork)
	pol.register(cmd.Flags())
	return cmd
}

func renderNetwork(w io.Writer, n api.SandboxNetwork) error {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	line("IPv4", n.IPv4)
	line("IPv6", n.IPv6)
	line("Egress", n.Policy.Egress)
	if len(n.Policy.Allow) > 0 {
		line("Allow", strings.Join(n.Policy.Allow, ", "))
	}
	if len(n.Policy.Deny) > 0 {
		line("Deny", strings.Join(n.Policy.Deny, ", "))
	}
	if b := n.Policy.Bandwidth; b != nil {
		capOf := func(mbit float64) string {
			if mbit == 0 {
				return "no cap"
			}
			return strconv.FormatFloat(mbit, 'f', -1, 64) + " Mbit/s"
		}
		line("Bandwidth", "egress "+capOf(b.EgressMbit)+", ingress "+capOf(b.IngressMbit))
	}
	return tw.Flush()
}
