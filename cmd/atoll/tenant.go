package main

import (
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
)

func newTenantCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "tenant",
		Short: "Show tenants' use against their quotas; set quotas (admin keys)",
		Example: `  atoll tenant set team-a --max-sandboxes 50 --max-cpu 40 --max-memory 80Gi --max-disk 500Gi --creates-per-second 20
  atoll tenant ls
  atoll tenant inspect team-a`,
		Long: `A tenant is the team its API keys belong to ("atoll key create"). Admins
give a tenant a quota: what its sandboxes may hold at once (sandboxes, CPUs,
memory, disk) and how many sandboxes a second it may create. A create, start,
resume or fork that would go over a quota is refused with 429 quota_exceeded,
naming the quota, its limit and the tenant's use; a create over the rate with
429 and Retry-After.

What counts is what a sandbox holds on its node: its CPUs, memory and one of
--max-sandboxes while it is creating, starting, running or paused; its disk
while its files are on a node (also stopped, suspended or shelved); nothing
once archived. In a cluster the quotas hold across all nodes; the rate is
each API node's.`,
	}
	cmd.AddCommand(newTenantSetCmd(g), newTenantListCmd(g), newTenantInspectCmd(g))
	return cmd
}

// quotaFlags are "tenant set"'s flags, each parsed into the quota by set.
var quotaFlags = []struct {
	name, usage string
	set         func(q *api.TenantQuota, v string) error
}{
	{"max-sandboxes", "most sandboxes running or paused at once", func(q *api.TenantQuota, v string) error {
		n, err := parseLimit(v, func(v string) (float64, error) { n, err := strconv.Atoi(v); return float64(n), err })
		q.MaxSandboxes = int(n)
		return err
	}},
	{"max-cpu", "most CPUs its running sandboxes hold", func(q *api.TenantQuota, v string) (err error) {
		q.MaxCPU, err = parseLimit(v, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) })
		return err
	}},
	{"max-memory", "most memory its running sandboxes hold (Mi, Gi, Ti; bare: MiB)", func(q *api.TenantQuota, v string) error {
		n, err := parseLimit(v, func(v string) (float64, error) { n, err := parseSize(v, 20); return float64(n), err })
		q.MaxMemoryMiB = int64(n)
		return err
	}},
	{"max-disk", "most disk its sandboxes' files hold on nodes (Gi, Ti; bare: GiB)", func(q *api.TenantQuota, v string) error {
		n, err := parseLimit(v, func(v string) (float64, error) { n, err := parseSize(v, 30); return float64(n), err })
		q.MaxDiskGiB = int64(n)
		return err
	}},
	{"creates-per-second", "most sandboxes it creates a second, on each API node", func(q *api.TenantQuota, v string) (err error) {
		q.CreatesPerSecond, err = parseLimit(v, func(v string) (float64, error) { return strconv.ParseFloat(v, 64) })
		return err
	}},
}

// parseLimit reads a limit: 0 or "none" (no limit), else what parse
// reads, which must be a positive, finite number.
func parseLimit(v string, parse func(string) (float64, error)) (float64, error) {
	if v == "none" || v == "0" {
		return 0, nil
	}
	n, err := parse(v)
	if err != nil || n <= 0 || math.IsInf(n, 0) || math.IsNaN(n) {
		return 0, fmt.Errorf("%q: want a positive number, or 0 or none for no limit", v)
	}
	return n, nil
}

func newTenantSetCmd(g *globals) *cobra.Command {
	var asJSON bool
	set := &cobra.Command{
		Use:   "set TENANT [--max-sandboxes N] [--max-cpu N] [--max-memory SIZE] [--max-disk SIZE] [--creates-per-second N]",
		Short: "Set a tenant's quota (admin keys only)",
		Long: `Set the limits of a tenant's quota that the flags name; the others stay as
they are. 0 or "none" removes a limit. A lowered limit holds back what would
grow the tenant's use; what runs already keeps running.`,
		Example: `  atoll tenant set team-a --max-sandboxes 50 --max-cpu 40 --max-memory 80Gi --max-disk 500Gi
  atoll tenant set team-a --creates-per-second 20
  atoll tenant set team-a --max-cpu none`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.GetTenant(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			q := t.Quota
			changed := false
			for _, f := range quotaFlags {
				if !cmd.Flags().Changed(f.name) {
					continue
				}
				v, _ := cmd.Flags().GetString(f.name)
				if err := f.set(&q, v); err != nil {
					return fmt.Errorf("--%s %w", f.name, err)
				}
				changed = true
			}
			if !changed {
				return fmt.Errorf("nothing to set: name a limit (--max-sandboxes, --max-cpu, --max-memory, --max-disk, --creates-per-second)")
			}
			if t, err = c.SetQuota(cmd.Context(), args[0], q); err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), t)
			}
			return renderTenant(cmd.OutOrStdout(), t)
		},
	}
	for _, f := range quotaFlags {
		set.Flags().String(f.name, "", f.usage+`; 0 or "none": no limit`)
	}
	set.Flags().BoolVar(&asJSON, "json", false, "print the tenant as JSON")
	return set
}

func newTenantListCmd(g *globals) *cobra.Command {
	var asJSON bool
	list := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the tenants with their use against their quotas (admin keys only)",
		Long: `List every tenant that has a key, a sandbox, a snapshot or a quota: what its
sandboxes hold, "of" its limit ("-" for none).`,
		Example: `  atoll tenant ls
  atoll tenant ls --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			ts, err := c.ListTenants(cmd.Context())
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), ts)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TENANT\tSANDBOXES\tCPU\tMEMORY\tDISK\tCREATES/S")
			for _, t := range ts {
				fmt.Fprintf(tw, "%s\t%s\n", t.Name, strings.Join(usageCells(t), "\t"))
			}
			return tw.Flush()
		},
	}
	list.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return list
}

func newTenantInspectCmd(g *globals) *cobra.Command {
	var asJSON bool
	inspect := &cobra.Command{
		Use:   "inspect TENANT",
		Short: "Show a tenant's use against its quota",
		Long: `Show what a tenant's sandboxes hold against each limit of its quota. Any key
shows its own tenant; admin keys show any.`,
		Example: `  atoll tenant inspect team-a`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			t, err := c.GetTenant(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), t)
			}
			return renderTenant(cmd.OutOrStdout(), t)
		},
	}
	inspect.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return inspect
}

// usageCells are t's use "of" each limit: sandboxes, CPU, memory, disk,
// and its rate.
func usageCells(t api.Tenant) []string {
	of := func(used string, limit float64, unit func(float64) string) string {
		if limit <= 0 {
			return used + " of -"
		}
		return used + " of " + unit(limit)
	}
	num := func(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }
	mib := func(v float64) string { return sizeText(int64(v), 20) }
	gib := func(v float64) string { return sizeText(int64(v), 30) }
	rate := "-"
	if t.Quota.CreatesPerSecond > 0 {
		rate = num(t.Quota.CreatesPerSecond)
	}
	return []string{
		of(strconv.Itoa(t.Used.Sandboxes), float64(t.Quota.MaxSandboxes), num),
		of(num(t.Used.CPU), t.Quota.MaxCPU, num),
		of(mib(float64(t.Used.MemoryMiB)), float64(t.Quota.MaxMemoryMiB), mib),
		of(gib(float64(t.Used.DiskGiB)), float64(t.Quota.MaxDiskGiB), gib),
		rate,
	}
}

// sizeText is n units of 2^shift bytes in the largest of Mi, Gi, Ti that
// it is a whole number of.
func sizeText(n int64, shift uint) string {
	units := []struct {
		suffix string
		shift  uint
	}{{"Ti", 40}, {"Gi", 30}, {"Mi", 20}}
	for _, u := range units {
		if u.shift >= shift && n%(1<<(u.shift-shift)) == 0 && (n != 0 || u.shift == shift) {
			return strconv.FormatInt(n>>(u.shift-shift), 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + units[len(units)-1].suffix
}

func renderTenant(w io.Writer, t api.Tenant) error {
	cells := usageCells(t)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "Tenant:\t%s\n", t.Name)
	fmt.Fprintf(tw, "Admin:\t%v\n", t.Admin)
	for i, label := range []string{"Sandboxes", "CPU", "Memory", "Disk"} {
		fmt.Fprintf(tw, "%s:\t%s\n", label, cells[i])
	}
	fmt.Fprintf(tw, "Creates/s:\t%s\n", cells[4])
	return tw.Flush()
}
