package main

import (
	"os/exec"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/api"
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
