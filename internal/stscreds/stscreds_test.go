package stscreds_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/stscreds"
)

func TestPolicy(t *testing.T) {
	for _, tc := range []struct {
		name, bucket, prefix string
		readOnly             bool
		want                 string
	}{
		{"read only", "archive", "vaults/v1/", true,
			`{"Version":"2012-10-17","Statement":[` +
				`{"Sid":"VaultObjects","Effect":"Allow","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::archive/vaults/v1/*"]},` +
				`{"Sid":"VaultList","Effect":"Allow","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::archive"],"Condition":{"StringLike":{"s3:prefix":["vaults/v1/","vaults/v1/*"]}}}]}`},
		{"read write", "archive", "vaults/v1/", false,
			`{"Version":"2012-10-17","Statement":[` +
				`{"Sid":"VaultObjects","Effect":"Allow","Action":["s3:GetObject","s3:PutObject","s3:DeleteObject"],"Resource":["arn:aws:s3:::archive/vaults/v1/*"]},` +
				`{"Sid":"VaultList","Effect":"Allow","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::archive"],"Condition":{"StringLike":{"s3:prefix":["vaults/v1/","vaults/v1/*"]}}}]}`},
		// Odd but harmless characters pass through JSON unescaped (no
		// \u0026 for &) and unchanged.
		{"odd characters", "my.bucket", `team a&b/"q"/<x>/vaults/0a-_.~/`, true,
			`{"Version":"2012-10-17","Statement":[` +
				`{"Sid":"VaultObjects","Effect":"Allow","Action":["s3:GetObject"],"Resource":["arn:aws:s3:::my.bucket/team a&b/\"q\"/<x>/vaults/0a-_.~/*"]},` +
				`{"Sid":"VaultList","Effect":"Allow","Action":["s3:ListBucket"],"Resource":["arn:aws:s3:::my.bucket"],"Condition":{"StringLike":{"s3:prefix":["team a&b/\"q\"/<x>/vaults/0a-_.~/","team a&b/\"q\"/<x>/vaults/0a-_.~/*"]}}}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := stscreds.Policy(tc.bucket, tc.prefix, tc.readOnly)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Fatalf("policy\n got %s\nwant %s", got, tc.want)
			}
			var doc map[string]any
			if err := json.Unmarshal([]byte(got), &doc); err != nil {
				t.Fatalf("not JSON: %v", err)
			}
		})
	}
	// What would widen the policy is refused, not written.
	for _, prefix := range []string{"vaults/*/", "vaults/v?/", "${aws:username}/vaults/v1/", "vaults/v1", "/vaults/v1/"} {
		if _, err := stscreds.Policy("archive", prefix, true); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Policy(%q) = %v, want ErrInvalid", prefix, err)
		}
	}
	if _, err := stscreds.Policy("arch*", "vaults/v1/", true); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("bucket with a wildcard: %v, want ErrInvalid", err)
	}
}

func TestSessionName(t *testing.T) {
	for _, tc := range []struct{ tenant, id, want string }{
		{"default", "0123abcd", "atoll-default-0123abcd"},
		{"team a/b", "v:1", "atoll-team_a_b-v_1"},
		{"t", strings.Repeat("x", 100), "atoll-t-" + strings.Repeat("x", 56)},
	} {
		if got := stscreds.SessionName(tc.tenant, tc.id); got != tc.want || len(got) > 64 {
			t.Errorf("SessionName(%q, %q) = %q, want %q", tc.tenant, tc.id, got, tc.want)
		}
	}
}

func TestNewRefuses(t *testing.T) {
	ctx := context.Background()
	for _, cfg := range []stscreds.Config{
		{RoleARN: "role", BlobURL: "s3://archive?region=us-east-1"},
		{RoleARN: "arn:aws:iam::1:role/r", BlobURL: "file:///tmp/x"},
		{RoleARN: "arn:aws:iam::1:role/r", BlobURL: "s3://archive?region=us-east-1&prefix=a*/"},
		{RoleARN: "arn:aws:iam::1:role/r", BlobURL: "s3://archive?region=us-east-1&prefix=dir"},
	} {
		if _, err := stscreds.New(ctx, cfg); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
}

// stsServer speaks STS's AssumeRole query API, as far as the test needs:
// it records the form of each request and answers with credentials.
type stsServer struct {
	mu    sync.Mutex
	forms []url.Values
	auth  []string
}

func (s *stsServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := r.ParseForm(); err != nil || r.Method != "POST" {
		http.Error(w, "bad request", 400)
		return
	}
	s.mu.Lock()
	s.forms = append(s.forms, r.PostForm)
	s.auth = append(s.auth, r.Header.Get("Authorization"))
	s.mu.Unlock()
	if r.PostForm.Get("Action") != "AssumeRole" {
		w.WriteHeader(400)
		fmt.Fprint(w, `<ErrorResponse><Error><Type>Sender</Type><Code>InvalidAction</Code><Message>no</Message></Error></ErrorResponse>`)
		return
	}
	w.Header().Set("Content-Type", "text/xml")
	fmt.Fprintf(w, `<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
<AssumeRoleResult>
<AssumedRoleUser><Arn>arn:aws:sts::1:assumed-role/r/%s</Arn><AssumedRoleId>AROA:x</AssumedRoleId></AssumedRoleUser>
<Credentials>
<AccessKeyId>ASIATEST</AccessKeyId>
<SecretAccessKey>secret</SecretAccessKey>
<SessionToken>token</SessionToken>
<Expiration>2030-01-02T03:04:05Z</Expiration>
</Credentials>
</AssumeRoleResult>
<ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleResponse>`, r.PostForm.Get("RoleSessionName"))
}

func TestMint(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "AKIASERVER")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "server-secret")
	t.Setenv("AWS_CONFIG_FILE", "/dev/null")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
	t.Setenv("AWS_EC2_METADATA_DISABLED", "true")
	srv := &stsServer{}
	hs := httptest.NewServer(srv)
	defer hs.Close()
	ctx := context.Background()
	m, err := stscreds.New(ctx, stscreds.Config{RoleARN: "arn:aws:iam::123456789012:role/atoll-vaults",
		BlobURL: "s3://archive?region=eu-west-1&prefix=atoll/&endpoint=http://minio:9000&use_path_style=true", STSEndpoint: hs.URL})
	if err != nil {
		t.Fatal(err)
	}
	c, err := m.Mint(ctx, "acme", "v1", 20*time.Minute, true)
	if err != nil {
		t.Fatal(err)
	}
	if c.AccessKeyID != "ASIATEST" || c.SecretAccessKey != "secret" || c.SessionToken != "token" ||
		!c.Expiration.Equal(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)) || c.Bucket != "archive" ||
		c.Prefix != "atoll/vaults/v1/" || c.Region != "eu-west-1" || c.Endpoint != "http://minio:9000" || !c.ReadOnly {
		t.Fatalf("credentials %+v", c)
	}
	if len(srv.forms) != 1 {
		t.Fatalf("%d STS requests, want 1", len(srv.forms))
	}
	f := srv.forms[0]
	want, _ := stscreds.Policy("archive", "atoll/vaults/v1/", true)
	for k, v := range map[string]string{"Action": "AssumeRole", "Version": "2011-06-15", "RoleArn": "arn:aws:iam::123456789012:role/atoll-vaults",
		"RoleSessionName": "atoll-acme-v1", "DurationSeconds": "1200", "Policy": want} {
		if f.Get(k) != v {
			t.Errorf("STS request %s = %q, want %q", k, f.Get(k), v)
		}
	}
	// Signed with the server's credentials, for the region of the URL.
	if a := srv.auth[0]; !strings.Contains(a, "Credential=AKIASERVER/") || !strings.Contains(a, "/eu-west-1/sts/") {
		t.Errorf("Authorization %q", a)
	}

	// Outside STS's bounds, nothing is asked.
	for _, ttl := range []time.Duration{14 * time.Minute, 13 * time.Hour, 15*time.Minute + time.Millisecond} {
		if _, err := m.Mint(ctx, "acme", "v1", ttl, true); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("ttl %s: %v, want ErrInvalid", ttl, err)
		}
	}
	// STS refusing is unavailable, with its word.
	hs.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(403)
		fmt.Fprint(w, `<ErrorResponse><Error><Type>Sender</Type><Code>AccessDenied</Code><Message>not authorized to assume</Message></Error><RequestId>2</RequestId></ErrorResponse>`)
	})
	if _, err := m.Mint(ctx, "acme", "v1", time.Hour, false); !errors.Is(err, errdefs.ErrUnavailable) || !strings.Contains(err.Error(), "AccessDenied") {
		t.Errorf("refused: %v", err)
	}
	if len(srv.forms) != 1 {
		t.Errorf("%d STS requests, want 1", len(srv.forms))
	}
}
