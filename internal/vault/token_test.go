package vault

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

func TestToken(t *testing.T) {
	key := []byte("0123456789abcdef0123456789abcdef")
	now := time.Now()
	tok := Token{Vault: "v1", Name: "notes", Tenant: "default", Sandbox: "sb1", ReadOnly: true, Expires: now.Add(time.Minute)}
	s := tok.Sign(key)
	if !IsToken(s) {
		t.Fatalf("%q is not a token", s)
	}
	got, err := ParseToken(key, s, now)
	if err != nil || got.Vault != "v1" || got.Sandbox != "sb1" || !got.ReadOnly || got.Name != "notes" || got.Tenant != "default" {
		t.Fatalf("ParseToken: %+v, %v", got, err)
	}
	body, sig, _ := strings.Cut(strings.TrimPrefix(s, TokenPrefix), ".")
	forged := Token{Vault: "v1", Name: "notes", Tenant: "default", Sandbox: "sb1", Expires: now.Add(time.Hour)}.Sign([]byte("another key, another key, another"))
	_, fsig, _ := strings.Cut(strings.TrimPrefix(forged, TokenPrefix), ".")
	for name, bad := range map[string]struct {
		s   string
		at  time.Time
		why string
	}{
		"expired":          {s, now.Add(time.Minute), "expired"},
		"long expired":     {s, now.Add(time.Hour), "expired"},
		"another key":      {forged, now, "not signed"},
		"swapped body":     {TokenPrefix + strings.TrimPrefix(forged, TokenPrefix)[:strings.Index(strings.TrimPrefix(forged, TokenPrefix), ".")] + "." + sig, now, "not signed"},
		"another sig":      {TokenPrefix + body + "." + fsig, now, "not signed"},
		"no signature":     {TokenPrefix + body, now, "malformed"},
		"api key":          {"ak_0123456789", now, "malformed"},
		"huge":             {TokenPrefix + strings.Repeat("a", 1<<20), now, "too long"},
		"empty":            {"", now, "malformed"},
		"bad base64":       {TokenPrefix + "!!!." + sig, now, "not signed"},
		"signed non-JSON":  {signRaw(key, "bm90IGpzb24"), now, "malformed"},
		"signed no fields": {signRaw(key, "e30"), now, "malformed"},
	} {
		_, err := ParseToken(key, bad.s, bad.at)
		if !errors.Is(err, errdefs.ErrUnauthorized) || !strings.Contains(err.Error(), bad.why) {
			t.Errorf("%s: %v, want unauthorized %q", name, err, bad.why)
		}
		if err != nil && len(bad.s) > 20 && strings.Contains(err.Error(), bad.s) {
			t.Errorf("%s: the error echoes the token", name)
		}
	}
}

func signRaw(key []byte, body string) string {
	return TokenPrefix + body + "." + b64(tokenMAC(key, body))
}

func TestCheckMounts(t *testing.T) {
	got, err := CheckMounts([]api.VaultMount{{Name: "notes"}, {Name: "hb", ReadOnly: true, Path: "/srv/hb"}})
	if err != nil || got[0].Path != "/home/user/memory/notes" || got[1].Path != "/srv/hb" || !got[1].ReadOnly {
		t.Fatalf("CheckMounts: %+v, %v", got, err)
	}
	for name, ms := range map[string][]api.VaultMount{
		"bad name":        {{Name: "../x"}},
		"slash name":      {{Name: "a/b"}},
		"relative path":   {{Name: "a", Path: "memory/a"}},
		"dotdot path":     {{Name: "a", Path: "/home/user/../../etc"}},
		"root":            {{Name: "a", Path: "/"}},
		"quote in path":   {{Name: "a", Path: "/home/user/a'b"}},
		"space in path":   {{Name: "a", Path: "/home/user/a b"}},
		"dot dir":         {{Name: "a", Path: "/home/user/.ssh"}},
		"unclean":         {{Name: "a", Path: "/home//user/a"}},
		"twice":           {{Name: "a"}, {Name: "a", Path: "/x"}},
		"overlapping":     {{Name: "a", Path: "/x"}, {Name: "b", Path: "/x/y"}},
		"same path":       {{Name: "a", Path: "/x"}, {Name: "b", Path: "/x"}},
		"too many mounts": make([]api.VaultMount, api.MaxVaultMounts+1),
	} {
		if name == "too many mounts" {
			for i := range ms {
				ms[i].Name = "v" + string(rune('a'+i))
			}
		}
		if _, err := CheckMounts(ms); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("%s: %v, want invalid", name, err)
		}
	}
}
