package main

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/atoll-dev/atoll/api"
)

func newVaultCredentialsCmd(g *globals) *cobra.Command {
	var ttl time.Duration
	var readWrite, asJSON, asEnv bool
	cmd := &cobra.Command{
		Use:   "credentials NAME [--ttl 15m] [--read-write] [--json|--env]",
		Short: "Mint temporary S3 credentials limited to a vault's objects",
		Long: `Mint temporary object-storage credentials (AWS STS AssumeRole) that reach
only the vault's objects in the server's S3 store: its packs, under the
prefix printed. They read; with --read-write they also write and delete,
which bypasses the vault's refs: a pack written or deleted behind the
server's back is unknown to the vault or breaks it, so push through git
(and only a vault made with --allow-rewrite gives them).
For agents that read the store directly; the server needs an s3:// --blob
and --vault-sts-role. --ttl is 15m to 12h (the role's maximum session
duration may be less). --env prints export lines for a shell; see
docs/vault.md.`,
		Example: `  atoll vault credentials notes
  eval "$(atoll vault credentials notes --ttl 1h --env)"
  aws s3 ls "s3://$ATOLL_VAULT_BUCKET/$ATOLL_VAULT_PREFIX" --recursive`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if asJSON && asEnv {
				return errors.New("--json and --env: pick one")
			}
			if ttl%time.Second != 0 {
				return fmt.Errorf("--ttl %s: want whole seconds", ttl)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			creds, err := c.VaultCredentials(cmd.Context(), args[0], api.VaultCredentialsRequest{TTLSeconds: int(ttl / time.Second), ReadWrite: readWrite})
			if err != nil {
				return err
			}
			switch {
			case asJSON:
				return renderJSON(cmd.OutOrStdout(), creds)
			case asEnv:
				_, err := io.WriteString(cmd.OutOrStdout(), credentialsEnv(creds))
				return err
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			for _, kv := range [][2]string{{"bucket", creds.Bucket}, {"prefix", creds.Prefix}, {"region", creds.Region}, {"endpoint", creds.Endpoint},
				{"read only", fmt.Sprint(creds.ReadOnly)}, {"expires", creds.Expiration.Format(time.RFC3339)},
				{"access key id", creds.AccessKeyID}, {"secret access key", creds.SecretAccessKey}, {"session token", creds.SessionToken}} {
				if kv[1] != "" {
					fmt.Fprintf(tw, "%s\t%s\n", kv[0], kv[1])
				}
			}
			return tw.Flush()
		},
	}
	cmd.Flags().DurationVar(&ttl, "ttl", 15*time.Minute, "how long the credentials last: 15m to 12h")
	cmd.Flags().BoolVar(&readWrite, "read-write", false, "also allow writing and deleting the vault's objects (bypasses git: for repair tools)")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print the credentials as JSON")
	cmd.Flags().BoolVar(&asEnv, "env", false, "print export lines: the AWS_* variables the AWS CLI and SDKs read, and ATOLL_VAULT_BUCKET, ATOLL_VAULT_PREFIX")
	return cmd
}

// credentialsEnv is creds as export lines for a POSIX shell, each value
// single-quoted.
func credentialsEnv(creds api.VaultCredentials) string {
	var b strings.Builder
	for _, kv := range [][2]string{{"AWS_ACCESS_KEY_ID", creds.AccessKeyID}, {"AWS_SECRET_ACCESS_KEY", creds.SecretAccessKey},
		{"AWS_SESSION_TOKEN", creds.SessionToken}, {"AWS_REGION", creds.Region}, {"AWS_ENDPOINT_URL_S3", creds.Endpoint},
		{"ATOLL_VAULT_BUCKET", creds.Bucket}, {"ATOLL_VAULT_PREFIX", creds.Prefix}} {
		if kv[1] != "" {
			fmt.Fprintf(&b, "export %s='%s'\n", kv[0], strings.ReplaceAll(kv[1], "'", `'\''`))
		}
	}
	return b.String()
}
