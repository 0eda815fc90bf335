package gitpack_test

import (
	"bytes"
	"compress/zlib"
	"crypto/sha1"
	"encoding/binary"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/atoll-dev/atoll/internal/vault/gitpack"
)

func git(t *testing.T, dir string, stdin []byte, args ...string) []byte {
	t.Helper()
	cmd := exec.Command("git", args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GIT_CONFIG_NOSYSTEM=1", "GIT_CONFIG_GLOBAL=/dev/null",
		"GIT_AUTHOR_NAME=t", "GIT_AUTHOR_EMAIL=t@example.com", "GIT_COMMITTER_NAME=t", "GIT_COMMITTER_EMAIL=t@example.com")
	cmd.Stdin = bytes.NewReader(stdin)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("git %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

var lim = gitpack.Limits{Objects: 10000, Bytes: 64 << 20}

// thinPack makes a repository with two commits, the second editing a
// large file, and returns the repository (packed, as a vault's cache is)
// and git's thin pack of the second commit: its blob and tree deltas
// against the first's, which it does not carry.
func thinPack(t *testing.T) (repo string, pack []byte, head string) {
	t.Helper()
	work := t.TempDir()
	git(t, work, nil, "init", "-q", "-b", "main")
	text := strings.Repeat("a line of a note that deltas well\n", 200)
	os.WriteFile(filepath.Join(work, "a.md"), []byte(text), 0o644)
	os.MkdirAll(filepath.Join(work, "dir"), 0o755)
	os.WriteFile(filepath.Join(work, "dir", "b.md"), []byte("b\n"), 0o644)
	git(t, work, nil, "add", "-A")
	git(t, work, nil, "commit", "-q", "-m", "one")
	first := strings.TrimSpace(string(git(t, work, nil, "rev-parse", "HEAD")))
	os.WriteFile(filepath.Join(work, "a.md"), []byte(text+"one more\n"), 0o644)
	git(t, work, nil, "commit", "-q", "-am", "two")
	head = strings.TrimSpace(string(git(t, work, nil, "rev-parse", "HEAD")))
	pack = git(t, work, []byte(head+"\n^"+first+"\n"), "pack-objects", "--thin", "--stdout", "--revs", "-q")
	repo = filepath.Join(t.TempDir(), "repo.git")
	git(t, work, nil, "clone", "-q", "--bare", "--no-local", work, repo)
	git(t, repo, nil, "update-ref", "refs/heads/main", first)
	git(t, repo, nil, "repack", "-q", "-a", "-d")
	return repo, pack, head
}

// TestThinPackAsGitDoes checks a thin pack read, completed and indexed
// here against git's index-pack --fix-thin of the same bytes: the same
// pack name, an index byte for byte the same, objects git reads.
func TestThinPackAsGitDoes(t *testing.T) {
	repo, pack, head := thinPack(t)
	r, err := gitpack.OpenRepo(repo)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	pk, err := gitpack.Read(pack, func(o gitpack.OID) (int, []byte, bool) {
		typ, data, err := r.Read(o, 1<<20)
		return typ, data, err == nil
	}, lim)
	if err != nil {
		t.Fatal(err)
	}
	if len(pk.Bases) == 0 {
		t.Fatal("git's pack was not thin: the test proves nothing")
	}
	data, objs, err := pk.Complete()
	if err != nil {
		t.Fatal(err)
	}
	idx := gitpack.Index(data, objs)

	// git's own index-pack, in an empty repository: it takes the completed
	// pack as one that stands alone, names it as Name does and indexes it
	// byte for byte as Index does.
	alone := filepath.Join(t.TempDir(), "alone.git")
	git(t, t.TempDir(), nil, "init", "-q", "--bare", alone)
	out := git(t, alone, data, "index-pack", "--stdin")
	name := strings.TrimSpace(strings.TrimPrefix(string(out), "pack\t"))
	if gitpack.Name(data) != name {
		t.Errorf("the completed pack is named %s, git's %s", gitpack.Name(data), name)
	}
	got, err := os.ReadFile(filepath.Join(alone, "objects", "pack", "pack-"+name+".idx"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(idx, got) {
		t.Errorf("the index differs from git's (%d bytes, git's %d)", len(idx), len(got))
	}
	git(t, alone, nil, "verify-pack", filepath.Join(alone, "objects", "pack", "pack-"+name+".idx"))
	git(t, alone, nil, "cat-file", "-e", head)

	// The repository reads them back, once the pack is there.
	r2, err := gitpack.OpenRepo(alone)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close()
	for _, o := range objs {
		typ, d, err := r2.Read(o.OID, 1<<20)
		if err != nil || typ != o.Type || gitpack.Hash(typ, d) != o.OID {
			t.Errorf("reading %s back: type %d, %v", o.OID, typ, err)
		}
		if got := r2.Type(o.OID); got != o.Type {
			t.Errorf("Type(%s) = %d, want %d", o.OID, got, o.Type)
		}
	}
}

// TestHostilePacks checks that broken and hostile packs are errors, never
// a panic, a hang or an allocation of what they claim.
func TestHostilePacks(t *testing.T) {
	repo, pack, _ := thinPack(t)
	r, err := gitpack.OpenRepo(repo)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	ext := func(o gitpack.OID) (int, []byte, bool) {
		typ, data, err := r.Read(o, 1<<20)
		return typ, data, err == nil
	}
	none := func(gitpack.OID) (int, []byte, bool) { return 0, nil, false }
	seal := func(body []byte) []byte {
		s := sha1.Sum(body)
		return append(append([]byte(nil), body...), s[:]...)
	}
	entry := func(typ int, size uint64, payload []byte, raw ...byte) []byte {
		var b []byte
		c := byte(typ<<4) | byte(size&15)
		size >>= 4
		for size != 0 {
			b = append(b, c|0x80)
			c = byte(size & 0x7f)
			size >>= 7
		}
		b = append(b, c)
		b = append(b, raw...)
		var z bytes.Buffer
		zw := zlib.NewWriter(&z)
		zw.Write(payload)
		zw.Close()
		return append(b, z.Bytes()...)
	}
	header := func(n uint32) []byte {
		h := []byte("PACK\x00\x00\x00\x02\x00\x00\x00\x00")
		binary.BigEndian.PutUint32(h[8:], n)
		return h
	}
	blob := entry(gitpack.Blob, 5, []byte("hello"))
	cases := map[string]struct {
		pack []byte
		ext  gitpack.Source
	}{
		"empty":               {nil, none},
		"not a pack":          {seal([]byte("JUNK\x00\x00\x00\x02\x00\x00\x00\x00")), none},
		"bad checksum":        {append(header(1), append(blob, make([]byte, 20)...)...), none},
		"truncated":           {seal(append(header(2), blob...)), none},
		"junk after entries":  {seal(append(append(header(1), blob...), 'x')), none},
		"size says more":      {seal(append(header(1), entry(gitpack.Blob, 6, []byte("hello"))...)), none},
		"size says less":      {seal(append(header(1), entry(gitpack.Blob, 4, []byte("hello"))...)), none},
		"claims a huge size":  {seal(append(header(1), entry(gitpack.Blob, 1<<40, []byte("x"))...)), none},
		"claims many objects": {seal(append(header(1<<30), blob...)), none},
		"type 5":              {seal(append(header(1), entry(5, 5, []byte("hello"))...)), none},
		"ofs-delta before the pack": {seal(append(header(1),
			entry(6, 4, []byte{5, 5, 0x90, 5}, 0x7f)...)), none},
		"ref-delta to nothing": {seal(append(header(1),
			entry(7, 4, []byte{5, 5, 0x90, 5}, make([]byte, 20)...)...)), none},
		"delta copies outside its base": {seal(append(append(header(2), blob...),
			entry(6, 4, []byte{5, 9, 0x90, 9}, byte(len(blob)+12-12))...)), none},
		"delta opcode 0": {seal(append(append(header(2), blob...),
			entry(6, 3, []byte{5, 1, 0}, byte(len(blob)))...)), none},
		"thin pack without its bases": {pack, none},
	}
	// A delta whose base is itself.
	self := gitpack.Hash(gitpack.Blob, []byte("hello"))
	cases["ref-delta to itself"] = struct {
		pack []byte
		ext  gitpack.Source
	}{seal(append(header(1), entry(7, 4, []byte{5, 5, 0x90, 5}, self[:]...)...)), none}
	for name, c := range cases {
		if _, err := gitpack.Read(c.pack, c.ext, lim); err == nil {
			t.Errorf("%s: read without an error", name)
		}
	}
	// Every byte of a real thin pack changed in turn: an error or objects
	// whose names are their content's, never a panic.
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 3000 {
		b := bytes.Clone(pack)
		b[rng.IntN(len(b)-20)] ^= byte(1 + rng.IntN(255))
		if i%2 == 0 {
			b = seal(b[:len(b)-20]) // past the checksum, into the entries
		}
		pk, err := gitpack.Read(b, ext, lim)
		if err != nil {
			continue
		}
		for _, o := range pk.Objects {
			if gitpack.Hash(o.Type, o.Data) != o.OID {
				t.Fatalf("an object named other than its content")
			}
		}
	}
}

// TestChecks checks the trees and commits refused, each of which git
// fsck refuses or this package leaves to git.
func TestChecks(t *testing.T) {
	id := strings.Repeat("\x01", 20)
	tree := func(entries ...string) []byte { return []byte(strings.Join(entries, "")) }
	e := func(mode, name string) string { return mode + " " + name + "\x00" + id }
	good := tree(e("100644", ".gitignore"), e("100644", "a.md"), e("40000", "a"), e("100755", "b"), e("120000", "c"))
	if _, err := gitpack.ParseTree(good); err != nil {
		t.Errorf("a good tree: %v", err)
	}
	for name, bad := range map[string][]byte{
		"dot":             tree(e("100644", ".")),
		"dotdot":          tree(e("40000", "..")),
		"empty name":      tree(e("100644", "")),
		"slash":           tree(e("100644", "a/b")),
		".git":            tree(e("40000", ".git")),
		".GIT":            tree(e("40000", ".GIT")),
		"HFS .git":        tree(e("40000", ".g\u200cit")),
		"NTFS git~1":      tree(e("40000", "GIT~1")),
		"NTFS .git.":      tree(e("40000", ".git.")),
		".gitmodules":     tree(e("100644", ".gitmodules")),
		".gitignore link": tree(e("120000", ".gitignore")),
		"submodule":       tree(e("160000", "sub")),
		"zero-padded":     tree(e("040000", "a")),
		"mode 100664":     tree(e("100664", "a")),
		"unsorted":        tree(e("100644", "b"), e("100644", "a")),
		"twice":           tree(e("100644", "a"), e("100644", "a")),
		"file and tree":   tree(e("100644", "a"), e("100644", "a.b"), e("40000", "a")),
		"truncated":       tree(e("100644", "a"))[:10],
	} {
		if _, err := gitpack.ParseTree(bad); err == nil {
			t.Errorf("tree %s: taken", name)
		}
	}
	hex := strings.Repeat("ab", 20)
	who := "A U Thor <a@example.com> 1700000000 +0100"
	if c, err := gitpack.ParseCommit([]byte("tree " + hex + "\nparent " + hex + "\nauthor " + who + "\ncommitter " + who + "\n\nmsg\n")); err != nil || len(c.Parents) != 1 {
		t.Errorf("a good commit: %+v, %v", c, err)
	}
	for name, bad := range map[string]string{
		"no tree":         "author " + who + "\ncommitter " + who + "\n\nm",
		"upper-case tree": "tree " + strings.ToUpper(hex) + "\nauthor " + who + "\ncommitter " + who + "\n\nm",
		"no author":       "tree " + hex + "\ncommitter " + who + "\n\nm",
		"bad email":       "tree " + hex + "\nauthor A <a@b 1 +0000\ncommitter " + who + "\n\nm",
		"bad zone":        "tree " + hex + "\nauthor A <a@b> 1 +00\ncommitter " + who + "\n\nm",
		"zero-padded":     "tree " + hex + "\nauthor A <a@b> 01 +0000\ncommitter " + who + "\n\nm",
		"no blank line":   "tree " + hex + "\nauthor " + who + "\ncommitter " + who + "\n",
		"NUL in header":   "tree " + hex + "\nauthor " + who + "\x00\ncommitter " + who + "\n\nm",
		"other header":    "tree " + hex + "\nauthor " + who + "\ncommitter " + who + "\nmergetag x\n\nm",
	} {
		if _, err := gitpack.ParseCommit([]byte(bad)); err == nil {
			t.Errorf("commit %s: taken", name)
		}
	}
}

// TestObjectTwice checks that a pack carrying one object twice (whole,
// then as a delta that copies it) is refused, as git index-pack --strict
// refuses it.
func TestObjectTwice(t *testing.T) {
	blob := append([]byte{0x30 | 5}, z([]byte("hello"))...)
	delta := append([]byte{0x60 | 4, byte(len(blob))}, z([]byte{5, 5, 0x90, 5})...)
	if _, err := gitpack.Read(mkPack(blob, delta), nil, lim); err == nil {
		t.Error("a pack with an object twice: read")
	}
}

// TestLooseObjects checks that a repository's loose objects are read and
// typed as git wrote them, and that an object it lacks is type 0.
func TestLooseObjects(t *testing.T) {
	dir := t.TempDir()
	git(t, dir, nil, "init", "-q", "--bare", ".")
	blob := strings.TrimSpace(string(git(t, dir, []byte("hello\n"), "hash-object", "-w", "--stdin")))
	tree := strings.TrimSpace(string(git(t, dir, []byte("100644 blob "+blob+"\ta.md\n"), "mktree")))
	r, err := gitpack.OpenRepo(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	for id, want := range map[string]int{blob: gitpack.Blob, tree: gitpack.Tree, strings.Repeat("ab", 20): 0} {
		o, _ := gitpack.ParseOID(id)
		if got := r.Type(o); got != want {
			t.Errorf("Type(%s) = %d, want %d", id, got, want)
		}
		if want == 0 {
			continue
		}
		typ, data, err := r.Read(o, 1<<20)
		if err != nil || typ != want || gitpack.Hash(typ, data) != o {
			t.Errorf("Read(%s): %d, %v", id, typ, err)
		}
	}
}
