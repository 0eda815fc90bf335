package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/atoll-dev/atoll/api"
)

// renderList writes sandboxes as a table for people.
func renderList(w io.Writer, sbs []api.Sandbox, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATE\tTEMPLATE\tCPU\tMEMORY\tDISK\tCREATED\tLABELS")
	for _, sb := range sbs {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.State, sb.Template,
			formatCPU(sb.CPU), formatMiB(sb.MemoryMiB), formatGiB(sb.DiskGiB), ago(sb.CreatedAt, now), formatMap(sb.Labels, ","))
	}
	return tw.Flush()
}

// renderInspect writes one sandbox as aligned "Key: value" lines. Environment
// values are left out: they often hold secrets (--json shows them).
func renderInspect(w io.Writer, sb api.Sandbox, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	line("ID", sb.ID)
	line("State", sb.State)
	if sb.Error != "" {
		line("Error", sb.Error)
	}
	// NAME@ID: what --template takes to make another of the same version.
	line("Template", sb.Template+orEmptyAt(sb.TemplateVersion))
	line("Runtime", sb.Runtime)
	line("CPU", formatCPU(sb.CPU))
	line("Memory", formatMiB(sb.MemoryMiB))
	line("Disk", formatGiB(sb.DiskGiB))
	pids := "-"
	if sb.PIDs > 0 {
		pids = strconv.FormatInt(sb.PIDs, 10)
	}
	line("PIDs", pids)
	line("Created", formatTime(sb.CreatedAt, now))
	if sb.StartedAt != nil {
		line("Started", formatTime(*sb.StartedAt, now))
	}
	if sb.StoppedAt != nil {
		line("Stopped", formatTime(*sb.StoppedAt, now))
	}
	if sb.ExpiresAt != nil {
		line("Expires", sb.ExpiresAt.UTC().Format(time.RFC3339)+" ("+until(*sb.ExpiresAt, now)+")")
	}
	if sb.Ephemeral {
		line("Ephemeral", "yes (deleted when it stops)")
	}
	if sb.AutoDeleteSec > 0 {
		line("Auto-delete", formatSeconds(sb.AutoDeleteSec)+" after it stops")
	}
	if sb.AutoStopSec > 0 {
		line("Auto-stop", "after "+formatSeconds(sb.AutoStopSec)+" idle")
	}
	if sb.CheckpointEverySec > 0 {
		last := "none yet"
		if sb.CheckpointedAt != nil {
			last = "last " + sb.CheckpointedAt.Format(time.RFC3339)
		}
		line("Checkpoints", "every "+formatSeconds(sb.CheckpointEverySec)+", "+last)
	}
	if sb.RestoredFrom != "" {
		line("Restored from", sb.RestoredFrom)
	}
	if sb.AutoArchiveSec > 0 {
		line("Auto-archive", formatSeconds(sb.AutoArchiveSec)+" after it stops")
	}
	if sb.AutoResume {
		line("Auto-resume", "yes (traffic wakes it; its timeout pauses it)")
	}
	if n := sb.Network; n != nil {
		line("Network", n.IPv4+", "+n.IPv6)
		egress := n.Policy.Egress
		if len(n.Policy.Allow) > 0 {
			egress += "; allow " + strings.Join(n.Policy.Allow, ", ")
		}
		if len(n.Policy.Deny) > 0 {
			egress += "; deny " + strings.Join(n.Policy.Deny, ", ")
		}
		line("Egress", egress)
	}
	line("Labels", formatMap(sb.Labels, ", "))
	if len(sb.Env) > 0 {
		line("Env", strings.Join(slices.Sorted(maps.Keys(sb.Env)), ", ")+" (values hidden; see --json)")
	}
	return tw.Flush()
}

func renderJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func formatCPU(c float64) string {
	if c == 0 {
		return "-"
	}
	return strconv.FormatFloat(c, 'f', -1, 64)
}

func formatMiB(n int64) string {
	switch {
	case n == 0:
		return "-"
	case n%1024 == 0:
		return fmt.Sprintf("%d GiB", n/1024)
	}
	return fmt.Sprintf("%d MiB", n)
}

func formatGiB(n int64) string {
	if n == 0 {
		return "-"
	}
	return fmt.Sprintf("%d GiB", n)
}

func formatMap(m map[string]string, sep string) string {
	if len(m) == 0 {
		return "-"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, k+"="+m[k])
	}
	return strings.Join(parts, sep)
}

func formatTime(t, now time.Time) string {
	return t.UTC().Format(time.RFC3339) + " (" + ago(t, now) + ")"
}

// until is how long after now t is, roughly, as people say it.
func until(t, now time.Time) string {
	d := t.Sub(now)
	if d <= 0 {
		return "due"
	}
	return "in " + roughly(d)
}

// roughly is d, not negative, in its largest whole unit up to days, as
// people say it: 42s, 5m, 30h (up to two days), 3d.
func roughly(d time.Duration) string {
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d.Minutes()))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d.Hours()))
	}
	return fmt.Sprintf("%dd", int(d.Hours()/24))
}

// formatSeconds writes sec as a duration without zero tails: 24h, 1h30m, 90s → 1m30s.
func formatSeconds(sec int64) string {
	s := (time.Duration(sec) * time.Second).String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// ago is how long before now t was, roughly, as people say it.
func ago(t, now time.Time) string {
	if t.IsZero() {
		return "-"
	}
	d := now.Sub(t)
	if d < 0 {
		return "just now"
	}
	return roughly(d) + " ago"
}

// renderTemplates writes templates as a table for people.
func renderTemplates(w io.Writer, ts []api.Template, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tVERSION\tOLD\tSOURCE\tLAYERS\tSHARED\tSIZE\tSANDBOXES\tCREATED")
	for _, t := range ts {
		if t.Removed {
			fmt.Fprintf(tw, "%s\t(removed)\t%d\t-\t-\t-\t-\t%d\t-\n", t.Name, t.OldVersions, t.Sandboxes)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%d\t%d\t%s\t%d\t%s\n", t.Name, versionOf(t), t.OldVersions, orDash(t.Source), len(t.Layers),
			t.SharedLayers, formatSize(t.Size), t.Sandboxes, ago(t.CreatedAt, now))
	}
	return tw.Flush()
}

// renderSnapshots writes snapshots as a table for people.
func renderSnapshots(w io.Writer, snaps []api.Snapshot, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tSANDBOX\tTEMPLATE\tSTATE\tSANDBOXES\tCREATED")
	for _, s := range snaps {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%d\t%s\n", s.ID, orDash(s.Name), orDash(s.SandboxID),
			orDash(s.Template), orDash(s.State), s.Sandboxes, ago(s.CreatedAt, now))
	}
	return tw.Flush()
}

// renderTemplate writes one template as aligned "Key: value" lines, its
// layers one per line.
func renderTemplate(w io.Writer, t api.Template, now time.Time) error {
	tw := tabwriter.NewWriter(w, 0, 4, 1, ' ', 0)
	line := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	line("Name", t.Name)
	if t.Removed {
		line("Version", "- (the name was removed; its versions stay while in use)")
		line("Sandboxes", strconv.Itoa(t.Sandboxes))
		if err := tw.Flush(); err != nil {
			return err
		}
		return renderVersions(w, t, now)
	}
	line("Version", versionOf(t)+orEmpty(" ", t.VersionID))
	line("Source", orDash(t.Source))
	if t.Digest != "" {
		line("Digest", t.Digest)
	}
	line("Size", formatSize(t.Size))
	line("Sandboxes", strconv.Itoa(t.Sandboxes))
	if t.CreatedAt.IsZero() {
		line("Created", "-")
	} else {
		line("Created", formatTime(t.CreatedAt, now))
	}
	if t.Entrypoint != nil {
		line("Entrypoint", formatArgv(t.Entrypoint))
	}
	if t.Cmd != nil {
		line("Cmd", formatArgv(t.Cmd))
	}
	if t.Workdir != "" {
		line("Workdir", t.Workdir)
	}
	if t.User != "" {
		line("User", t.User)
	}
	list := func(k string, vs []string) {
		if len(vs) == 0 {
			line(k, "-")
			return
		}
		line(k, vs[0])
		for _, v := range vs[1:] {
			fmt.Fprintf(tw, "\t%s\n", v)
		}
	}
	// Image Env is part of the published image, not a secret of a sandbox's.
	list("Env", t.Env)
	list(fmt.Sprintf("Layers (%d)", len(t.Layers)), t.Layers)
	if err := tw.Flush(); err != nil {
		return err
	}
	return renderVersions(w, t, now)
}

// renderVersions writes a template's versions as a table after a blank line.
func renderVersions(w io.Writer, t api.Template, now time.Time) error {
	if len(t.Versions) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "VERSION\tID\tCURRENT\tLAYERS\tSANDBOXES\tSNAPSHOTS\tCREATED")
	for _, v := range t.Versions {
		cur := ""
		if v.Current {
			cur = "yes"
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%d\t%d\t%s\n", v.Number, v.ID, orDash(cur), len(v.Layers), v.Sandboxes, v.Snapshots, ago(v.CreatedAt, now))
	}
	return tw.Flush()
}

// versionOf is a template's version number, or "-" for the built-in one.
func versionOf(t api.Template) string {
	if t.Version == 0 {
		return "-"
	}
	return strconv.Itoa(t.Version)
}

func orEmptyAt(version string) string {
	if version == "" {
		return ""
	}
	return "@" + version
}

func orEmpty(prefix, s string) string {
	if s == "" {
		return ""
	}
	return prefix + "(" + s + ")"
}

// formatArgv writes an argument vector as JSON, which shows its word boundaries.
func formatArgv(argv []string) string {
	b, _ := json.Marshal(argv)
	return string(b)
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// formatSize is formatBytes, or "-" for 0: the builtin template has no layers.
func formatSize(n int64) string {
	if n == 0 {
		return "-"
	}
	return formatBytes(n)
}

// formatBytes is n in binary units, as people read sizes.
func formatBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	v, i := float64(n)/unit, 0
	for v >= unit && i < 3 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f %s", v, []string{"KiB", "MiB", "GiB", "TiB"}[i])
}
