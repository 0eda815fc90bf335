package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
)

func newPortCmd(g *globals) *cobra.Command {
	var signed, public, private, asJSON bool
	var ttl time.Duration
	cmd := &cobra.Command{
		Use:   "port ID PORT [--signed [--ttl 1h]] [--public|--private]",
		Short: "Print the URL of a sandbox's port",
		Long: `Print the URL at which the server's port proxy serves a port of a sandbox:
http://{port}-{id}.{domain}/, by default under localhost, whose names
browsers and curl resolve to this machine.

A sandbox's ports are private unless it was created with --public-ports or
made public with --public: a request needs the sandbox's access token in the
Atoll-Access-Token header (--json shows it), or a signed URL. --signed prints
a URL that opens the port with no header until --ttl has passed. --private
takes public access back; tokens and signed URLs open the ports again.`,
		Example: `  atoll port 3k9x2m7q1w8e5r4t6y0u 8080
  atoll port 3k9x2m7q1w8e5r4t6y0u 8080 --signed --ttl 1h
  atoll port 3k9x2m7q1w8e5r4t6y0u 8080 --public
  curl -H "Atoll-Access-Token: $(atoll port 3k9x2m7q1w8e5r4t6y0u 8080 --json | jq -r .token)" http://8080-3k9x2m7q1w8e5r4t6y0u.localhost:7401/`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var port int
			if _, err := fmt.Sscanf(args[1], "%d", &port); err != nil || fmt.Sprint(port) != args[1] || port < 1 || port > 65535 {
				return fmt.Errorf("malformed port %q: want 1 to 65535", args[1])
			}
			if public && private {
				return fmt.Errorf("--public and --private exclude each other")
			}
			if cmd.Flags().Changed("ttl") && !signed {
				return fmt.Errorf("--ttl needs --signed")
			}
			if signed && (ttl < time.Second || ttl > 365*24*time.Hour) {
				return fmt.Errorf("--ttl must be between 1s and a year")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			if public || private {
				if _, err := c.SetPorts(cmd.Context(), args[0], api.PortAccess{Public: public}); err != nil {
					return err
				}
			}
			var sign time.Duration
			if signed {
				sign = ttl
			}
			u, err := c.PortURL(cmd.Context(), args[0], port, sign)
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), u)
			}
			if signed {
				fmt.Fprintln(cmd.OutOrStdout(), u.SignedURL)
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), u.URL)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&signed, "signed", false, "print a signed URL that needs no token")
	f.DurationVar(&ttl, "ttl", time.Hour, "how long a signed URL stays valid")
	f.BoolVar(&public, "public", false, "first make the sandbox's ports public: no token needed")
	f.BoolVar(&private, "private", false, "first make the sandbox's ports private: a token or signed URL needed")
	f.BoolVar(&asJSON, "json", false, "print JSON, with the token")
	return cmd
}
