package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// parseWhen reads a time flag: RFC 3339, or a duration before now
// ("1h", "30m").
func parseWhen(flag, v string, now time.Time) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("--%s %q: want an RFC 3339 time or a duration ago (1h, 30m)", flag, v)
	}
	return t, nil
}

func newAuditCmd(g *globals) *cobra.Command {
	var q api.AuditQuery
	var from, to string
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "audit [--tenant T] [--sandbox ID] [--action A] [--since 1h | --from TIME] [--to TIME] [-n N]",
		Short: "Show the audit log: every API request that asked for a change (admin keys)",
		Long: `Show the audit log, newest first: every API request that asked for a change
(any method but GET, HEAD and OPTIONS, on the REST API and the E2B-compatible
one), whether it succeeded or not, with its time, tenant, key ID, source
address, action (the route), target and HTTP status. A request refused for its
key has no tenant. "atoll serve --audit-retention" says how long entries are
kept.`,
		Example: `  atoll audit
  atoll audit --tenant team-a --since 24h
  atoll audit --sandbox 3k2j4h5g6f7d8s9a0q1w
  atoll audit --action 'DELETE /v1/sandboxes/{id}' --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			now := time.Now()
			var err error
			if q.From, err = parseWhen("since", from, now); err != nil {
				return err
			}
			if q.To, err = parseWhen("to", to, now); err != nil {
				return err
			}
			return show(g, cmd, asJSON, func(ctx context.Context, c *atoll.Client) (api.AuditList, error) { return c.Audit(ctx, q) }, renderAudit)
		},
	}
	f := cmd.Flags()
	f.StringVar(&q.Tenant, "tenant", "", "one tenant's requests")
	f.StringVar(&q.Sandbox, "sandbox", "", "requests about one sandbox (or any target: snapshot, template, key, webhook)")
	f.StringVar(&q.Action, "action", "", `one route's requests, as "POST /v1/sandboxes/{id}/stop", or a method's (DELETE)`)
	f.StringVar(&from, "since", "", "requests from this time (RFC 3339) or this long ago (24h)")
	f.StringVar(&from, "from", "", "the same as --since")
	f.StringVar(&to, "to", "", "requests up to this time (RFC 3339) or this long ago")
	f.IntVarP(&q.Limit, "limit", "n", 50, "show at most this many (1-1000)")
	f.Int64Var(&q.Before, "before", 0, "entries older than this seq (the next page: the last one shown)")
	f.BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func renderAudit(w io.Writer, l api.AuditList) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SEQ\tTIME\tTENANT\tKEY\tSOURCE\tACTION\tTARGET\tSTATUS")
	for _, e := range l.Entries {
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%s\t%d\n", e.Seq, e.Time.Local().Format(time.DateTime), orDash(e.Tenant), orDash(e.KeyID),
			e.Source, e.Action, orDash(e.Target), e.Status)
	}
	return tw.Flush()
}

func newEventsCmd(g *globals) *cobra.Command {
	var opts atoll.EventsOptions
	var after int64
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "events [--sandbox ID] [--types T,...] [--after SEQ]",
		Short: "Follow sandboxes' lifecycle events as they happen",
		Long: `Follow the lifecycle events of the key's tenant's sandboxes (admin keys: every
tenant's) as they happen, until interrupted: created, started, stopped, paused,
resumed, archived, deleted, error, lost, and quota_exceeded when a tenant hits
a quota. In a cluster, every node's. --after SEQ first shows what came after
event SEQ, as far as the journal keeps it; the stream is the server's
Server-Sent Events at GET /v1/events.`,
		Example: `  atoll events
  atoll events --sandbox 3k2j4h5g6f7d8s9a0q1w
  atoll events --types error,lost --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("after") {
				opts.After = &after
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			s, err := c.Events(cmd.Context(), opts)
			if err != nil {
				return err
			}
			defer s.Close()
			out := cmd.OutOrStdout()
			for {
				e, err := s.Next()
				if errors.Is(err, io.EOF) || cmd.Context().Err() != nil {
					return nil
				}
				if err != nil {
					return err
				}
				if asJSON {
					if err := renderJSON(out, e); err != nil {
						return err
					}
					continue
				}
				line := fmt.Sprintf("%d  %s  %-14s %s  %s  %s", e.Seq, e.Time.Local().Format(time.DateTime), e.Type, e.Tenant, orDash(e.Sandbox), orDash(e.State))
				if e.Reason != "" {
					line += "  " + e.Reason
				}
				fmt.Fprintln(out, line)
			}
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Sandbox, "sandbox", "", "one sandbox's events")
	f.StringSliceVar(&opts.Types, "types", nil, "event types to show (comma-separated; default all)")
	f.Int64Var(&after, "after", 0, "first show the events after this seq (0: all the journal keeps)")
	f.BoolVar(&asJSON, "json", false, "print each event as a JSON line")
	return cmd
}

func newWebhookCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "webhook",
		Short: "Send a tenant's lifecycle events to URLs",
		Long: `A webhook POSTs each lifecycle event of the key's tenant that it wants to its
URL, as the event's JSON, signed: the header Atoll-Signature is t=UNIX,v1=HEX,
HEX the HMAC-SHA256 (keyed by the webhook's secret, shown once by "webhook
add") of UNIX, "." and the body. Atoll-Event-Id is the same on every attempt
of one event: drop repeats. A 2xx answer delivers it; any other, or none, is
tried again with backoff for a day. One sandbox's events arrive in order.
URLs on private, loopback or link-local addresses are refused unless the
server runs with --webhook-allow-private.`,
		Example: `  atoll webhook add https://ops.example.com/atoll --events error,lost,quota_exceeded
  atoll webhook ls
  atoll webhook deliveries 4f5g6h7j8k9l0z1x2c3v
  atoll webhook rm 4f5g6h7j8k9l0z1x2c3v`,
	}
	cmd.AddCommand(newWebhookAddCmd(g), newWebhookListCmd(g), newWebhookRmCmd(g), newWebhookDeliveriesCmd(g))
	return cmd
}

func newWebhookAddCmd(g *globals) *cobra.Command {
	var req api.CreateWebhookRequest
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "add URL [--events T,...]",
		Short: "Add a webhook; prints its ID and its signing secret (shown once)",
		Long: `Add a webhook for the key's tenant's events of the types --events names
(default: every type: ` + strings.Join(api.EventTypes, ", ") + `). It prints the
webhook's ID and its signing secret, which is never shown again.`,
		Example: `  atoll webhook add https://ops.example.com/atoll
  atoll webhook add https://ops.example.com/atoll --events stopped,deleted`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req.URL = args[0]
			return show(g, cmd, asJSON, func(ctx context.Context, c *atoll.Client) (api.Webhook, error) { return c.CreateWebhook(ctx, req) },
				func(w io.Writer, h api.Webhook) error {
					_, err := fmt.Fprintf(w, "%s\nsecret: %s\n", h.ID, h.Secret)
					return err
				})
		},
	}
	cmd.Flags().StringSliceVar(&req.Events, "events", nil, "event types to send (comma-separated; default all)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the webhook as JSON")
	return cmd
}

func newWebhookListCmd(g *globals) *cobra.Command {
	l := listing[api.Webhook]{
		json: func(ws []api.Webhook) any { return api.WebhookList{Webhooks: ws} },
		key:  func(w api.Webhook) string { return w.ID },
		table: func(w io.Writer, ws []api.Webhook, now time.Time) error {
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tURL\tEVENTS\tCREATED")
			for _, h := range ws {
				events := strings.Join(h.Events, ",")
				if events == "" {
					events = "all"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", h.ID, h.URL, events, ago(h.CreatedAt, now))
			}
			return tw.Flush()
		},
	}
	return l.command(g, &cobra.Command{
		Use:   "ls",
		Short: "List the key's tenant's webhooks",
		Long: `List the key's tenant's webhooks, oldest first, with the event types each
wants ("all" for every type); their secrets are never shown again.`,
		Example: `  atoll webhook ls
  atoll webhook ls -q`,
		Args: cobra.NoArgs,
	}, "IDs", func(ctx context.Context, c *atoll.Client, _ []string) ([]api.Webhook, error) {
		return c.ListWebhooks(ctx)
	})
}

func newWebhookRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:     "rm ID...",
		Aliases: []string{"remove"},
		Short:   "Remove webhooks and their deliveries",
		Long: `Remove webhooks of the key's tenant, with their deliveries: what is pending
is not sent. Another tenant's webhook is not found.`,
		Example: `  atoll webhook rm 4f5g6h7j8k9l0z1x2c3v`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return untilError(g, cmd, args, (*atoll.Client).DeleteWebhook)
		},
	}
}

func newWebhookDeliveriesCmd(g *globals) *cobra.Command {
	var limit int
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "deliveries ID [-n N]",
		Short: "Show a webhook's latest deliveries, newest first",
		Long: `Show a webhook's latest deliveries, newest first: each event, whether it was
delivered, is pending (with its next attempt) or failed (given up after a day),
its attempts and the last answer or error.`,
		Example: `  atoll webhook deliveries 4f5g6h7j8k9l0z1x2c3v -n 20`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return show(g, cmd, asJSON, func(ctx context.Context, c *atoll.Client) (api.DeliveryList, error) {
				ds, err := c.WebhookDeliveries(ctx, args[0], limit)
				return api.DeliveryList{Deliveries: ds}, err
			}, renderDeliveries)
		},
	}
	cmd.Flags().IntVarP(&limit, "limit", "n", 20, "show at most this many (1-1000)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	return cmd
}

func renderDeliveries(w io.Writer, l api.DeliveryList) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "EVENT\tTYPE\tSANDBOX\tSTATE\tATTEMPTS\tLAST\tNEXT")
	now := time.Now()
	for _, d := range l.Deliveries {
		last := "-"
		if d.LastStatus != 0 {
			last = strconv.Itoa(d.LastStatus)
		}
		if d.LastError != "" {
			last = d.LastError
		}
		next := "-"
		if d.State == "pending" && d.NextAt != nil {
			next = until(*d.NextAt, now)
		}
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%d\t%s\t%s\n", d.Event.Seq, d.Event.Type, orDash(d.Event.Sandbox), d.State, d.Attempts, last, next)
	}
	return tw.Flush()
}
