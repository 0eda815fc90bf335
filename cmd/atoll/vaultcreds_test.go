package main

import (
	"context"
	"os/exec"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/usage"
)

// TestCredentialsEnv: the export lines are what a shell reads back,
// whatever the values hold, and leave out what is empty.
func TestCredentialsEnv(t *testing.T) {
	c := api.VaultCredentials{AccessKeyID: "ASIA1", SecretAccessKey: `s'e"c$(r)e t`, SessionToken: "tok`en`", Bucket: "b", Prefix: "p/vaults/v1/", Region: "eu-west-1"}
	env := credentialsEnv(c)
	if strings.Contains(env, "AWS_ENDPOINT_URL_S3") {
		t.Errorf("empty endpoint exported:\n%s", env)
	}
	out, err := exec.Command("sh", "-c", env+`printf '%s|%s|%s|%s|%s' "$AWS_ACCESS_KEY_ID" "$AWS_SECRET_ACCESS_KEY" "$AWS_SESSION_TOKEN" "$ATOLL_VAULT_BUCKET" "$ATOLL_VAULT_PREFIX"`).CombinedOutput()
	if err != nil {
		t.Fatalf("sh: %v %s", err, out)
	}
	if want := "ASIA1|" + c.SecretAccessKey + "|" + c.SessionToken + "|b|p/vaults/v1/"; string(out) != want {
		t.Errorf("sh read back %q, want %q", out, want)
	}
}

// TestServeVaultSTSRole: --vault-sts-role is refused at start-up, before
// the state store opens, without an s3:// store or with a role or prefix
// the credentials could not be minted for.
func TestServeVaultSTSRole(t *testing.T) {
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	for _, tc := range []struct{ blob, role, want string }{
		{"file://" + t.TempDir(), "arn:aws:iam::1:role/r", "needs an s3:// object store"},
		{"s3://archive?region=us-east-1", "r", "not an ARN"},
		{"s3://archive?region=us-east-1&prefix=a*/", "arn:aws:iam::1:role/r", "wildcard"},
	} {
		s := &serving{cfg: serveConfig{archive: tc.blob, vaultSTSRole: tc.role, usageInterval: usage.DefaultInterval}}
		err := s.openStores(context.Background())
		s.close()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--blob %s --vault-sts-role %s: %v, want %q", tc.blob, tc.role, err, tc.want)
		}
		if s.state != nil {
			t.Errorf("--blob %s: the state store was opened", tc.blob)
		}
	}
}
