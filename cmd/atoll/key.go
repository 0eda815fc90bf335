package main

import (
	"context"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

func newKeyCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Issue, list and revoke API keys (admin keys only)",
		Example: `  atoll key create --name team-a
  atoll key ls
  atoll key rm 0123456789abcdef0123`,
		Long: `Manage the server's API keys. Every key belongs to a tenant, and a tenant
sees only its own sandboxes and snapshots: another tenant's are "not found",
in atoll's API and in its E2B-compatible API alike. Templates are shared.

The key "atoll serve" makes at first start (in <data>/api-key) is the admin's,
of the tenant "default", which owns everything made before tenants existed.
Keys of that tenant are admin keys: only they issue and revoke keys and
import, build, tag or delete templates.

The server keeps only a hash of each key: "key create" prints the key once.`,
	}
	cmd.AddCommand(newKeyCreateCmd(g), newKeyListCmd(g), newKeyRmCmd(g))
	return cmd
}

func newKeyCreateCmd(g *globals) *cobra.Command {
	var tenant string
	var asJSON bool
	create := &cobra.Command{
		Use:   "create --name NAME [--tenant TENANT]",
		Short: "Issue a key and print it",
		Long: `Issue a key and print it (only the hash is kept, so this is the only copy).
Without --tenant the key gets a new tenant named after it (refused if a
tenant of that name exists, so that a name used twice does not join two
teams); --tenant T adds a key to tenant T, and --tenant default makes
another admin key. For E2B SDKs use it as E2B_API_KEY; the Python SDK
wants E2B's format, e2b_ and the hex part: E2B_API_KEY=e2b_${KEY#atoll_}.`,
		Example: `  atoll key create --name team-a
  atoll key create --name ci --tenant team-a
  atoll key create --name backup-admin --tenant default`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			name, _ := cmd.Flags().GetString("name")
			k, err := request(g, cmd, func(ctx context.Context, c *atoll.Client) (api.APIKey, error) {
				return c.CreateKey(ctx, api.CreateKeyRequest{Name: name, Tenant: tenant})
			})
			if err != nil {
				return err
			}
			if asJSON {
				return renderJSON(cmd.OutOrStdout(), k)
			}
			fmt.Fprintln(cmd.OutOrStdout(), k.Key)
			return nil
		},
	}
	create.Flags().String("name", "", "name of the key (1-63 of [A-Za-z0-9._-]); required")
	create.MarkFlagRequired("name")
	create.Flags().StringVar(&tenant, "tenant", "", "tenant of the key (default: a new one named after the key)")
	create.Flags().BoolVar(&asJSON, "json", false, "print JSON: ID, name, tenant and the key")
	return create
}

func newKeyListCmd(g *globals) *cobra.Command {
	return showCmd(g, &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List the keys (IDs, names, tenants; never the keys)",
		Long: `List the server's API keys: their IDs (the first 20 hex digits of each key's
SHA-256), names, tenants, whether they are admin keys, and when they were
made. The keys themselves are not kept, so they cannot be listed.`,
		Example: `  atoll key ls
  atoll key ls --json`,
		Args: cobra.NoArgs,
	}, "print JSON", func(ctx context.Context, c *atoll.Client, _ []string) ([]api.APIKey, error) {
		return c.ListKeys(ctx)
	}, renderKeys)
}

func renderKeys(w io.Writer, ks []api.APIKey) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tNAME\tTENANT\tADMIN\tCREATED")
	for _, k := range ks {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%v\t%s\n", k.ID, k.Name, k.Tenant, k.Admin, k.CreatedAt.Format("2006-01-02 15:04"))
	}
	return tw.Flush()
}

func newKeyRmCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "rm ID...",
		Short: "Revoke keys at once (not the last admin key)",
		Long: `Revoke keys by ID (from "atoll key ls"): requests with them are refused at
once. The tenant's sandboxes and snapshots stay; another key of the tenant
("atoll key create --name NAME --tenant TENANT") reaches them again. The last
admin key cannot be revoked.`,
		Example: `  atoll key rm 0123456789abcdef0123`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return untilError(g, cmd, args, (*atoll.Client).DeleteKey)
		},
	}
}
