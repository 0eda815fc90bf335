package main

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
)

func newUsageCmd(g *globals) *cobra.Command {
	var (
		q             api.UsageQuery
		since         time.Duration
		from, to      string
		asJSON, asCSV bool
	)
	cmd := &cobra.Command{
		Use:   "usage [--since 24h | --from TIME --to TIME] [--step 1m|1h|1d] [--group-by sandbox|tenant|template|label:KEY]",
		Short: "Show metered usage: CPU, memory, disk, storage, network and time in each state",
		Long: `Show what sandboxes used, as each node's meter recorded it every 10 seconds:
CPU-seconds, memory GiB-seconds (working set), GiB-hours of writable disk,
of snapshots and of archives, network bytes in and out, and seconds in each
state. Usage is summed in buckets of --step and grouped by sandbox, tenant,
template or a label's value. Deleted sandboxes' usage stays.

A key sees its own tenant's usage; an admin key sees every tenant's, or
one's with --tenant. Times are RFC 3339 or Unix seconds.`,
		Example: `  atoll usage
  atoll usage --since 168h --step 1d --group-by tenant
  atoll usage --group-by label:team --csv > usage.csv
  atoll usage --from 2026-12-01T00:00:00Z --to 2026-12-02T00:00:00Z --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if asJSON && asCSV {
				return fmt.Errorf("--json and --csv: choose one")
			}
			var err error
			if q.From, err = parseTime("--from", from); err != nil {
				return err
			}
			if q.To, err = parseTime("--to", to); err != nil {
				return err
			}
			if q.From.IsZero() && since > 0 {
				end := q.To
				if end.IsZero() {
					end = time.Now()
				}
				q.From = end.Add(-since)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			rep, err := c.Usage(cmd.Context(), q)
			if err != nil {
				return err
			}
			switch {
			case asJSON:
				return renderJSON(cmd.OutOrStdout(), rep)
			case asCSV:
				return renderUsageCSV(cmd.OutOrStdout(), rep)
			}
			return renderUsage(cmd.OutOrStdout(), rep)
		},
	}
	f := cmd.Flags()
	f.DurationVar(&since, "since", 24*time.Hour, "how far back from --to (or now) to look, unless --from is given")
	f.StringVar(&from, "from", "", "start (RFC 3339 or Unix seconds)")
	f.StringVar(&to, "to", "", "end, not included (RFC 3339 or Unix seconds; default now)")
	f.StringVar(&q.Step, "step", api.UsageByHour, "bucket: 1m, 1h or 1d")
	f.StringVar(&q.GroupBy, "group-by", api.UsageBySandbox, "sandbox, tenant, template or label:KEY")
	f.StringVar(&q.Tenant, "tenant", "", "the tenant whose usage to show (admin keys; default every tenant's)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	f.BoolVar(&asCSV, "csv", false, "print CSV, one row per bucket and group, with a header")
	return cmd
}

// parseTime reads flag's value v: RFC 3339 or Unix seconds; zero if empty.
func parseTime(flag, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if n, err := strconv.ParseInt(v, 10, 64); err == nil {
		return time.Unix(n, 0), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("%s %q: want RFC 3339 (2026-12-01T00:00:00Z) or Unix seconds", flag, v)
	}
	return t, nil
}

// usageColumns are the columns of the table and the CSV: a header and
// the cell of an entry, for the CSV exactly, for the table rounded.
var usageColumns = []struct {
	header, field string // the table's header, the CSV's (the API's field)
	csv, table    func(e api.UsageEntry) string
}{
	{"CPU_S", "cpu_seconds", func(e api.UsageEntry) string { return exact(e.CPUSeconds) }, func(e api.UsageEntry) string { return fixed(e.CPUSeconds, 1) }},
	{"MEM_GIB_S", "memory_gib_seconds", func(e api.UsageEntry) string { return exact(e.MemoryGiBSeconds) }, func(e api.UsageEntry) string { return fixed(e.MemoryGiBSeconds, 1) }},
	{"DISK_GIB_H", "disk_gib_hours", func(e api.UsageEntry) string { return exact(e.DiskGiBHours) }, func(e api.UsageEntry) string { return fixed(e.DiskGiBHours, 4) }},
	{"SNAP_GIB_H", "snapshot_gib_hours", func(e api.UsageEntry) string { return exact(e.SnapshotGiBHours) }, func(e api.UsageEntry) string { return fixed(e.SnapshotGiBHours, 4) }},
	{"ARCHIVE_GIB_H", "archive_gib_hours", func(e api.UsageEntry) string { return exact(e.ArchiveGiBHours) }, func(e api.UsageEntry) string { return fixed(e.ArchiveGiBHours, 4) }},
	{"NET_IN", "network_in_bytes", func(e api.UsageEntry) string { return strconv.FormatInt(e.NetInBytes, 10) }, func(e api.UsageEntry) string { return humanBytes(e.NetInBytes) }},
	{"NET_OUT", "network_out_bytes", func(e api.UsageEntry) string { return strconv.FormatInt(e.NetOutBytes, 10) }, func(e api.UsageEntry) string { return humanBytes(e.NetOutBytes) }},
	{"RUNNING_S", "running_seconds", func(e api.UsageEntry) string { return exact(e.States.Running) }, func(e api.UsageEntry) string { return fixed(e.States.Running, 0) }},
	{"PAUSED_S", "paused_seconds", func(e api.UsageEntry) string { return exact(e.States.Paused) }, func(e api.UsageEntry) string { return fixed(e.States.Paused, 0) }},
	{"SUSPENDED_S", "suspended_seconds", func(e api.UsageEntry) string { return exact(e.States.Suspended) }, func(e api.UsageEntry) string { return fixed(e.States.Suspended, 0) }},
	{"STOPPED_S", "stopped_seconds", func(e api.UsageEntry) string { return exact(e.States.Stopped) }, func(e api.UsageEntry) string { return fixed(e.States.Stopped, 0) }},
	{"ARCHIVED_S", "archived_seconds", func(e api.UsageEntry) string { return exact(e.States.Archived) }, func(e api.UsageEntry) string { return fixed(e.States.Archived, 0) }},
}

func exact(f float64) string           { return strconv.FormatFloat(f, 'f', -1, 64) }
func fixed(f float64, prec int) string { return strconv.FormatFloat(f, 'f', prec, 64) }

// humanBytes is n in B, KB, MB or GB (powers of 1000, as network
// traffic is counted).
func humanBytes(n int64) string {
	switch {
	case n >= 1e9:
		return fixed(float64(n)/1e9, 2) + "GB"
	case n >= 1e6:
		return fixed(float64(n)/1e6, 2) + "MB"
	case n >= 1e3:
		return fixed(float64(n)/1e3, 1) + "KB"
	}
	return strconv.FormatInt(n, 10) + "B"
}

func renderUsage(w io.Writer, rep api.UsageReport) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "START\t%s", groupHeader(rep.GroupBy))
	for _, c := range usageColumns {
		fmt.Fprintf(tw, "\t%s", c.header)
	}
	fmt.Fprintln(tw)
	for _, e := range rep.Usage {
		g := e.Group
		if g == "" {
			g = "-"
		}
		fmt.Fprintf(tw, "%s\t%s", e.Start.UTC().Format(time.RFC3339), g)
		for _, c := range usageColumns {
			fmt.Fprintf(tw, "\t%s", c.table(e))
		}
		fmt.Fprintln(tw)
	}
	return tw.Flush()
}

func renderUsageCSV(w io.Writer, rep api.UsageReport) error {
	cw := csv.NewWriter(w)
	head := []string{"start", rep.GroupBy}
	for _, c := range usageColumns {
		head = append(head, c.field)
	}
	if err := cw.Write(head); err != nil {
		return err
	}
	for _, e := range rep.Usage {
		rec := []string{e.Start.UTC().Format(time.RFC3339), e.Group}
		for _, c := range usageColumns {
			rec = append(rec, c.csv(e))
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// groupHeader is the table's header of the group column.
func groupHeader(groupBy string) string {
	if key, ok := strings.CutPrefix(groupBy, api.UsageByLabel); ok {
		return "LABEL:" + key
	}
	return strings.ToUpper(groupBy)
}
