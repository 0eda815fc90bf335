// Package tenant names who owns sandboxes and snapshots. Every API key
// belongs to a tenant (a team); the HTTP layers put the tenant of a
// request's key into its context, and the sandbox service shows a tenant
// only what it owns: another tenant's sandbox is not found, so that IDs
// do not tell whether they exist. Default is the tenant of the key made at
// first start, which owns what an older server made, and whose keys are
// the server's admin keys (they issue keys and manage templates).
package tenant

import "context"

// Default is the first tenant: the admin's.
const Default = "default"

type key struct{}

// NewContext returns ctx acting for tenant name.
func NewContext(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, key{}, name)
}

// FromContext returns the tenant ctx acts for. ok is false for the
// server's own work (policies, recovery, the port proxy's lookups, envd
// traffic checked by its token), which sees every tenant's sandboxes.
func FromContext(ctx context.Context) (name string, ok bool) {
	name, ok = ctx.Value(key{}).(string)
	return name, ok
}

// Of is the tenant a new sandbox or snapshot made under ctx belongs to.
func Of(ctx context.Context) string {
	if name, ok := FromContext(ctx); ok {
		return name
	}
	return Default
}

// Sees reports whether ctx may see what owner owns.
func Sees(ctx context.Context, owner string) bool {
	name, ok := FromContext(ctx)
	return !ok || name == owner
}

// IsAdmin reports whether name is the admin tenant.
func IsAdmin(name string) bool { return name == Default }

// Valid reports whether name is a tenant name: 1 to 63 of [a-z0-9-],
// starting with a letter or digit.
func Valid(name string) bool {
	if name == "" || len(name) > 63 || name[0] == '-' {
		return false
	}
	for i := 0; i < len(name); i++ {
		if c := name[i]; !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
