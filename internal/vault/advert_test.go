package vault

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestWithRefs: the advertisement made here for a set of refs is, byte for
// byte, the one git http-backend gives for a repository at those refs,
// for protocol 0 and 1, from an empty repository through branches, tags
// and a deletion, whichever advertisement it was made from.
func TestWithRefs(t *testing.T) {
	dir := t.TempDir()
	gitIn := func(env []string, stdin string, args ...string) []byte {
		t.Helper()
		cmd := exec.Command("git", args...)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), env...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("git %v: %v", args, err)
		}
		return out
	}
	gitIn(nil, "", "init", "-q", "--bare", ".")
	oid := func(s string) string {
		return strings.TrimSpace(string(gitIn(nil, s, "hash-object", "-w", "--stdin")))
	}
	commit := func(msg string) string {
		tree := strings.TrimSpace(string(gitIn(nil, "", "mktree")))
		return strings.TrimSpace(string(gitIn([]string{"GIT_AUTHOR_NAME=a", "GIT_AUTHOR_EMAIL=a@a", "GIT_COMMITTER_NAME=a", "GIT_COMMITTER_EMAIL=a@a"}, "", "commit-tree", tree, "-m", msg)))
	}
	c1, c2, blob := commit("one"), commit("two"), oid("x")
	// What git http-backend answers to GET info/refs?service=git-receive-pack.
	advert := func(proto string) []byte {
		var env []string
		if proto != "" {
			env = []string{"GIT_PROTOCOL=" + proto}
		}
		var b bytes.Buffer
		pkt(&b, "# service=git-receive-pack\n")
		b.WriteString("0000")
		b.Write(gitIn(env, "", "receive-pack", "--stateless-rpc", "--advertise-refs", "."))
		return b.Bytes()
	}
	steps := []map[string]string{
		{},
		{"refs/heads/main": c1},
		{"refs/heads/main": c2, "refs/heads/b": c1, "refs/tags/v1": blob, "refs/heads/a/z": c2},
		{"refs/heads/main": c2},
		{},
	}
	for _, proto := range []string{"", "version=1"} {
		var prev [][]byte
		for i, refs := range steps {
			var cmds strings.Builder
			for _, r := range []string{"refs/heads/main", "refs/heads/b", "refs/tags/v1", "refs/heads/a/z"} {
				if o, ok := refs[r]; ok {
					fmt.Fprintf(&cmds, "update %s %s\n", r, o)
				} else {
					fmt.Fprintf(&cmds, "delete %s\n", r)
				}
			}
			gitIn(nil, cmds.String(), "update-ref", "--stdin")
			want := advert(proto)
			prev = append(prev, want)
			for j, from := range prev {
				got, err := withRefs(from, refs)
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("protocol %q, refs %d from advertisement %d: %v\n got %q\nwant %q", proto, i, j, err, got, want)
				}
			}
		}
	}
	// Anything else is git's to make.
	for _, bad := range []string{
		"",
		"001f# service=git-receive-pack\n0000",
		"001f# service=git-receive-pack\n0000003f" + c1 + " refs/heads/main\x00\n0000",
		"zzzz",
		"001f# service=git-receive-pack\n00000040" + c1 + " refs/heads/main\x00x\n0031" + c1 + " .have\n0000",
	} {
		if got, err := withRefs([]byte(bad), map[string]string{"refs/heads/main": c2}); err == nil {
			t.Errorf("withRefs(%q) = %q, want an error", bad, got)
		}
	}
}
