// Package stscreds mints temporary object-storage credentials limited to
// one vault's objects: AWS STS AssumeRole with an inline session policy
// (Policy) that allows only the keys under the vault's prefix. Agents
// that read a vault's packs straight from the store use them instead of
// the server's own credentials, which reach the whole bucket.
//
// STS is external: what this package owns, and its tests check, is the
// request (the role, the duration, the policy document); what the
// credentials then allow is STS's and the bucket's to enforce.
package stscreds

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sts"
	gcaws "gocloud.dev/aws"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// TTL bounds: STS's minimum for AssumeRole, and its maximum for a role
// whose maximum session duration is raised to the most it can be. A role
// of a shorter maximum refuses a longer TTL itself.
const (
	MinTTL = 15 * time.Minute
	MaxTTL = 12 * time.Hour
)

// Config configures a Minter.
type Config struct {
	// RoleARN is the role to assume; its own policy must allow at least
	// what Policy allows (the session policy only narrows it).
	RoleARN string
	// BlobURL is the object store's URL, s3://bucket?..., as blob.Open
	// takes it: the bucket, the prefix and the AWS settings (region,
	// profile) the S3 client uses, which the STS client uses too, with
	// the same credentials. Its endpoint is S3's, not STS's.
	BlobURL string
	// STSEndpoint is the STS endpoint; "" for the AWS SDK's, which
	// AWS_ENDPOINT_URL_STS (or AWS_ENDPOINT_URL) overrides. An
	// S3-compatible store (MinIO) serves STS at its own endpoint.
	STSEndpoint string
}

// Minter mints credentials for vaults' prefixes.
type Minter struct {
	role     string
	bucket   string
	prefix   string // the store's, "" or ending in "/"
	region   string
	endpoint string // the S3 endpoint of the URL, "" for AWS's
	sts      *sts.Client
}

// awsParams are the query parameters of an s3:// URL that configure the
// AWS SDK rather than the S3 client (gocloud.dev/aws); the STS client
// takes these and no others. Not endpoint: that is S3's.
var awsParams = []string{"region", "profile", "role", "dualstack", "fips"}

// New returns a Minter for cfg; errdefs.ErrInvalid for a URL that is not
// s3:// or a prefix a policy cannot name exactly.
func New(ctx context.Context, cfg Config) (*Minter, error) {
	if !strings.HasPrefix(cfg.RoleARN, "arn:") {
		return nil, fmt.Errorf("%w: role %q is not an ARN (arn:aws:iam::ACCOUNT:role/NAME)", errdefs.ErrInvalid, cfg.RoleARN)
	}
	u, err := url.Parse(cfg.BlobURL)
	if err != nil || u.Scheme != "s3" || u.Host == "" {
		return nil, fmt.Errorf("%w: vault credentials need an s3://bucket object store", errdefs.ErrInvalid)
	}
	q := u.Query()
	m := &Minter{role: cfg.RoleARN, bucket: u.Host, prefix: q.Get("prefix"), region: q.Get("region"), endpoint: q.Get("endpoint")}
	if err := checkPolicyText(m.prefix); err != nil {
		return nil, fmt.Errorf("%w: bucket prefix %q: %v", errdefs.ErrInvalid, m.prefix, err)
	}
	if m.prefix != "" && !strings.HasSuffix(m.prefix, "/") {
		// gocloud's prefix is prepended as is; a policy of "a/b" would
		// also allow "a/bc", so a prefix must end a path segment.
		return nil, fmt.Errorf("%w: bucket prefix %q must end in /", errdefs.ErrInvalid, m.prefix)
	}
	aq := url.Values{}
	for _, k := range awsParams {
		if q.Has(k) {
			aq[k] = q[k]
		}
	}
	awsCfg, err := gcaws.V2ConfigFromURLParams(ctx, aq)
	if err != nil {
		return nil, fmt.Errorf("AWS configuration for STS: %w", err)
	}
	if m.region == "" {
		m.region = awsCfg.Region
	}
	m.sts = sts.NewFromConfig(awsCfg, func(o *sts.Options) {
		if cfg.STSEndpoint != "" {
			o.BaseEndpoint = aws.String(cfg.STSEndpoint)
		}
	})
	return m, nil
}

// checkPolicyText refuses what would mean more in a policy's resource or
// condition than its bytes: the wildcards * and ?, and ${...} policy
// variables. Vault IDs are generated; a store's prefix is the operator's.
func checkPolicyText(s string) error {
	if strings.ContainsAny(s, "*?") || strings.Contains(s, "${") {
		return errors.New("has a policy wildcard (* or ?) or variable (${)")
	}
	return nil
}

// VaultPrefix is the keys of vault id in a bucket under prefix.
func VaultPrefix(prefix, id string) string { return prefix + "vaults/" + id + "/" }

// Mint assumes the role for ttl with a session policy that allows
// reading (and, unless readOnly, writing and deleting) the objects of
// vault id, and listing no other keys.
func (m *Minter) Mint(ctx context.Context, tenant, id string, ttl time.Duration, readOnly bool) (api.VaultCredentials, error) {
	if ttl < MinTTL || ttl > MaxTTL || ttl%time.Second != 0 {
		return api.VaultCredentials{}, fmt.Errorf("%w: ttl must be whole seconds from %s to %s", errdefs.ErrInvalid, MinTTL, MaxTTL)
	}
	policy, err := Policy(m.bucket, VaultPrefix(m.prefix, id), readOnly)
	if err != nil {
		return api.VaultCredentials{}, err
	}
	out, err := m.sts.AssumeRole(ctx, &sts.AssumeRoleInput{
		RoleArn:         aws.String(m.role),
		RoleSessionName: aws.String(SessionName(tenant, id)),
		DurationSeconds: aws.Int32(int32(ttl / time.Second)),
		Policy:          aws.String(policy),
	})
	if err != nil {
		return api.VaultCredentials{}, fmt.Errorf("%w: STS AssumeRole: %v", errdefs.ErrUnavailable, err)
	}
	c := out.Credentials
	if c == nil || c.AccessKeyId == nil || c.SecretAccessKey == nil || c.SessionToken == nil || c.Expiration == nil {
		return api.VaultCredentials{}, fmt.Errorf("%w: STS AssumeRole answered without credentials", errdefs.ErrUnavailable)
	}
	return api.VaultCredentials{AccessKeyID: *c.AccessKeyId, SecretAccessKey: *c.SecretAccessKey, SessionToken: *c.SessionToken,
		Expiration: c.Expiration.UTC(), Bucket: m.bucket, Prefix: VaultPrefix(m.prefix, id), Region: m.region, Endpoint: m.endpoint,
		ReadOnly: readOnly}, nil
}

// statement is one statement of an IAM policy document.
type statement struct {
	Sid       string                         `json:"Sid"`
	Effect    string                         `json:"Effect"`
	Action    []string                       `json:"Action"`
	Resource  []string                       `json:"Resource"`
	Condition map[string]map[string][]string `json:"Condition,omitempty"`
}

// Policy is the session policy for the keys under objPrefix (ending in
// "/") of bucket: s3:GetObject on them (with s3:PutObject and
// s3:DeleteObject unless readOnly), and s3:ListBucket on the bucket only
// for list prefixes under objPrefix. errdefs.ErrInvalid if objPrefix
// holds a wildcard or variable that would widen it.
func Policy(bucket, objPrefix string, readOnly bool) (string, error) {
	if err := checkPolicyText(bucket + objPrefix); err != nil {
		return "", fmt.Errorf("%w: %q: %v", errdefs.ErrInvalid, bucket+"/"+objPrefix, err)
	}
	if !strings.HasSuffix(objPrefix, "/") || strings.HasPrefix(objPrefix, "/") {
		return "", fmt.Errorf("%w: object prefix %q must be a relative path ending in /", errdefs.ErrInvalid, objPrefix)
	}
	actions := []string{"s3:GetObject"}
	if !readOnly {
		actions = append(actions, "s3:PutObject", "s3:DeleteObject")
	}
	doc := struct {
		Version   string      `json:"Version"`
		Statement []statement `json:"Statement"`
	}{"2012-10-17", []statement{
		{Sid: "VaultObjects", Effect: "Allow", Action: actions, Resource: []string{"arn:aws:s3:::" + bucket + "/" + objPrefix + "*"}},
		{Sid: "VaultList", Effect: "Allow", Action: []string{"s3:ListBucket"}, Resource: []string{"arn:aws:s3:::" + bucket},
			Condition: map[string]map[string][]string{"StringLike": {"s3:prefix": {objPrefix, objPrefix + "*"}}}},
	}}
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // the policy is read by IAM and people, not a browser
	if err := enc.Encode(doc); err != nil {
		return "", err
	}
	return strings.TrimSuffix(b.String(), "\n"), nil
}

// SessionName is the RoleSessionName naming tenant and vault id, as
// CloudTrail shows it: "atoll-<tenant>-<id>", in STS's characters
// ([A-Za-z0-9+=,.@_-], others become "_") and at most 64 of them.
func SessionName(tenant, id string) string {
	name := []byte("atoll-" + tenant + "-" + id)
	for i, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("+=,.@_-", c) >= 0) {
			name[i] = '_'
		}
	}
	if len(name) > 64 {
		name = name[:64]
	}
	return string(name)
}
