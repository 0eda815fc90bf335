package gitpack

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// The checks below are a strict subset of what git fsck accepts: an
// object they pass, git's receive.fsckObjects passes too. What they
// refuse, git may accept (a submodule, a .gitmodules file, a name only
// another file system folds into .git): the caller then leaves the push
// to git, which decides.

// TreeEntry is one entry of a tree.
type TreeEntry struct {
	Mode string
	Name string
	OID  OID
}

// modes are the modes of a tree's entries taken here: files, executables,
// symlinks, trees. A submodule (160000) and git's old or zero-padded modes
// are left to git.
var modes = map[string]bool{"100644": true, "100755": true, "120000": true, "40000": true}

// ParseTree reads a tree's entries, refusing any git fsck would and any
// name that could stand for .git somewhere.
func ParseTree(data []byte) ([]TreeEntry, error) {
	var out []TreeEntry
	seen := map[string]bool{}
	prev := ""
	for len(data) > 0 {
		sp := bytes.IndexByte(data, ' ')
		if sp < 0 {
			return nil, errors.New("tree: an entry without a mode")
		}
		mode := string(data[:sp])
		data = data[sp+1:]
		nul := bytes.IndexByte(data, 0)
		if nul < 0 || len(data) < nul+1+20 {
			return nil, errors.New("tree: a truncated entry")
		}
		name := string(data[:nul])
		var id OID
		copy(id[:], data[nul+1:])
		data = data[nul+1+20:]
		if !modes[mode] {
			return nil, fmt.Errorf("tree: mode %q", mode)
		}
		if err := checkName(name, mode); err != nil {
			return nil, err
		}
		// git's order: a tree's name sorts as if it ended in "/".
		key := name
		if mode == "40000" {
			key += "/"
		}
		if seen[name] || key <= prev {
			return nil, fmt.Errorf("tree: %q out of order or twice", name)
		}
		seen[name], prev = true, key
		out = append(out, TreeEntry{Mode: mode, Name: name, OID: id})
	}
	return out, nil
}

// checkName refuses an entry name git refuses ("", ".", "..", a "/") and
// every name that holds "git" once folded to lower case and stripped of
// what is not ASCII (.git, .gitmodules, git~1, HFS+'s ignorable code
// points among them) but .gitignore and .gitkeep files, and every name
// with a "~" (NTFS's short names: git fsck takes gi7eba~1 for .gitmodules).
func checkName(name, mode string) error {
	// "~": NTFS's short names, gi7eba~1 for .gitmodules among them.
	if name == "" || name == "." || name == ".." || strings.ContainsAny(name, "/\\~") {
		return fmt.Errorf("tree: entry name %q", name)
	}
	folded := strings.Map(func(r rune) rune {
		if r >= 0x80 {
			return -1
		}
		return r
	}, strings.ToLower(name))
	if (name == ".gitignore" || name == ".gitkeep") && mode != "120000" && mode != "40000" {
		return nil // common, and nothing git fsck looks into as files
	}
	if strings.Contains(folded, "git") || strings.HasSuffix(name, ".") || strings.HasSuffix(name, " ") {
		return fmt.Errorf("tree: entry name %q is left to git", name)
	}
	return nil
}

// CommitInfo is what a commit names.
type CommitInfo struct {
	Tree    OID
	Parents []OID
}

// ident is an author or committer as git fsck takes it, strictly: a name
// without angle brackets, an email, seconds since the epoch, a zone.
var ident = regexp.MustCompile(`^[^<>\n]* <[^<>\n]*> (0|[1-9][0-9]{0,11}) [+-][0-9]{4}$`)

// ParseCommit reads a commit's tree and parents, refusing any commit git
// fsck would and any header but encoding and signatures.
func ParseCommit(data []byte) (CommitInfo, error) {
	var c CommitInfo
	head, _, ok := bytes.Cut(data, []byte("\n\n"))
	if !ok || bytes.IndexByte(data, 0) >= 0 {
		return c, errors.New("commit: unterminated, or a NUL in it")
	}
	lines := strings.Split(string(head), "\n")
	oid := func(l, prefix string) (OID, bool) {
		s, ok := strings.CutPrefix(l, prefix)
		if !ok {
			return OID{}, false
		}
		if strings.ToLower(s) != s {
			return OID{}, false
		}
		return ParseOID(s)
	}
	i := 0
	var found bool
	if c.Tree, found = oid(lines[0], "tree "); !found {
		return c, errors.New("commit: no tree first")
	}
	for i = 1; i < len(lines); i++ {
		p, ok := oid(lines[i], "parent ")
		if !ok {
			break
		}
		c.Parents = append(c.Parents, p)
	}
	for _, h := range []string{"author ", "committer "} {
		if i >= len(lines) || !strings.HasPrefix(lines[i], h) || !ident.MatchString(lines[i][len(h):]) {
			return c, fmt.Errorf("commit: no valid %sline", h)
		}
		i++
	}
	for ; i < len(lines); i++ {
		l := lines[i]
		switch {
		case strings.HasPrefix(l, "encoding "), strings.HasPrefix(l, "gpgsig "), strings.HasPrefix(l, "gpgsig-sha256 "):
		case strings.HasPrefix(l, " ") && i > 0: // a signature's continuation
		default:
			return c, fmt.Errorf("commit: header %.20q", l)
		}
	}
	return c, nil
}
