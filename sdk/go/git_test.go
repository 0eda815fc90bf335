package atoll

import (
	"errors"
	"reflect"
	"testing"
)

func TestParseGitStatus(t *testing.T) {
	out := "# branch.oid 1111111111111111111111111111111111111111\x00# branch.head main\x00" +
		"# branch.upstream origin/main\x00# branch.ab +2 -1\x00" +
		"1 .M N... 100644 100644 100644 aaaa bbbb README.md\x00" +
		"1 A. N... 000000 100644 100644 0000 cccc dir/with space.txt\x00" +
		"2 R. N... 100644 100644 100644 dddd dddd R100 new.go\x00old.go\x00" +
		"u UU N... 100644 100644 100644 100644 e1 e2 e3 both.txt\x00" +
		"? untracked\x00"
	got := parseGitStatus(out)
	want := GitStatus{Branch: "main", Upstream: "origin/main", Ahead: 2, Behind: 1, Files: []GitFileStatus{
		{Path: "README.md", Index: ".", Worktree: "M"},
		{Path: "dir/with space.txt", Index: "A", Worktree: "."},
		{Path: "new.go", OrigPath: "old.go", Index: "R", Worktree: "."},
		{Path: "both.txt", Index: "U", Worktree: "U"},
		{Path: "untracked", Index: "?", Worktree: "?"},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
	if got.Files[0].Staged() || !got.Files[1].Staged() || got.Files[4].Staged() {
		t.Error("Staged")
	}
	if d := parseGitStatus("# branch.oid (initial)\x00# branch.head (detached)\x00"); !d.Detached || d.Branch != "" || !d.Clean() {
		t.Errorf("detached: %+v", d)
	}
}

func TestSplitCredentials(t *testing.T) {
	for _, c := range []struct {
		in, url string
		auth    *GitAuth
		bad     bool
	}{
		{in: "https://u:p@git.example.com/r.git", url: "https://git.example.com/r.git", auth: &GitAuth{"u", "p"}},
		{in: "https://tok@git.example.com/r.git", url: "https://git.example.com/r.git", auth: &GitAuth{"tok", ""}},
		{in: "https://git.example.com/r.git", url: "https://git.example.com/r.git"},
		{in: "git@github.com:org/r.git", url: "git@github.com:org/r.git"},
		{in: "--upload-pack=x", bad: true},
		{in: "", bad: true},
	} {
		url, auth, err := splitCredentials(c.in, nil)
		if c.bad {
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%q: %v, want invalid", c.in, err)
			}
			continue
		}
		if err != nil || url != c.url || !reflect.DeepEqual(auth, c.auth) {
			t.Errorf("%q: %q %+v %v", c.in, url, auth, err)
		}
	}
	// An explicit auth wins over the URL's, which is still removed.
	url, auth, _ := splitCredentials("https://u:p@h/r", &GitAuth{"x", "y"})
	if url != "https://h/r" || *auth != (GitAuth{"x", "y"}) {
		t.Errorf("explicit auth: %q %+v", url, auth)
	}
}

func TestGitErrorKinds(t *testing.T) {
	for stderr, kind := range map[string]error{
		"fatal: Authentication failed for 'http://h/r.git/'":                       ErrUnauthorized,
		"fatal: could not read Username for 'http://h': terminal prompts disabled": ErrUnauthorized,
		" ! [rejected]        main -> main (fetch first)":                          ErrConflict,
		"fatal: not a git repository (or any of the parent directories): .git":     ErrNotFound,
		"fatal: a branch named 'main' already exists":                              ErrConflict,
		"fatal: invalid reference: nope":                                           ErrNotFound,
	} {
		if err := (&GitError{Op: "x", ExitCode: 128, Stderr: stderr}); !errors.Is(err, kind) {
			t.Errorf("%q is not %v", stderr, kind)
		}
	}
	if errors.Is(&GitError{Stderr: "fatal: something else"}, ErrConflict) {
		t.Error("an unknown failure has a kind")
	}
}
