package vault

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/vault/gitpack"
)

// A small push is taken in-process (fastReceive): an agent pushes a note
// or two at a time, and what git receive-pack spends on one (the
// index-pack and rev-list processes it starts, the hook and the
// connection back to this server) is most of the push's time on the
// server. Only the push git would certainly accept is taken so: new
// commits on branches, fast-forward, whose objects pass a strict subset of
// git fsck's checks, with capabilities this code speaks. Everything else
// (a refusal, a tag, a deletion, a submodule, a name near .git, a pack
// past fastPushMax) is left to git receive-pack, which sees the same
// request and decides as it always did: the fast path never refuses.
//
// go-git's receive-pack does not take thin packs (go-git issues 190 and
// 1119), which git sends on most pushes, so the pack is read here
// (gitpack), completed with its bases as index-pack --fix-thin does.
const fastPushMax = 1 << 20

// fastPushObjects bounds the objects of a pack taken in-process.
const fastPushObjects = 2000

// fastPushBytes bounds the bytes a push taken in-process inflates to (its
// objects, their deltas, its thin pack's bases), and fastPushSlots the
// pushes read in-process at once: together, the memory they may take.
const (
	fastPushBytes = 16 << 20
	fastPushSlots = 8
)

// fastCaps are the capabilities a client may ask for on a push taken
// in-process: those of the advertisement but atomic and push-options
// (agent is matched by prefix).
var fastCaps = map[string]bool{
	"report-status": true, "report-status-v2": true, "side-band-64k": true,
	"quiet": true, "ofs-delta": true, "object-format=sha1": true,
}

// branchName is a branch name git check-ref-format takes, strictly.
var branchName = regexp.MustCompile(`^refs/heads/[A-Za-z0-9_][A-Za-z0-9_.-]*(/[A-Za-z0-9_][A-Za-z0-9_.-]*)*$`)

type pushCommand struct {
	old, new gitpack.OID // old zero: a branch made
	oldHex   string
	ref      string
}

// readCommands reads a push request's commands (pkt-lines up to a flush)
// and returns them, the capabilities of the first, and the pack after
// them; ok false for any request not taken in-process.
func readCommands(b []byte) (cmds []pushCommand, caps []string, pack []byte, ok bool) {
	for {
		if len(b) < 4 {
			return nil, nil, nil, false
		}
		n, ok := pktLen(b[:4])
		if !ok || (n != 0 && (n < 4 || n > len(b))) {
			return nil, nil, nil, false
		}
		if n == 0 {
			return cmds, caps, b[4:], len(cmds) > 0
		}
		line := strings.TrimSuffix(string(b[4:n]), "\n")
		b = b[n:]
		if len(cmds) == 0 {
			var c string
			line, c, _ = strings.Cut(line, "\x00")
			caps = strings.Fields(c)
		}
		f := strings.Split(line, " ") // as git's parse_command: one space
		if len(f) != 3 || len(cmds) >= MaxRefs {
			return nil, nil, nil, false
		}
		old, ok1 := gitpack.ParseOID(f[0])
		nu, ok2 := gitpack.ParseOID(f[1])
		if !ok1 || !ok2 || nu == (gitpack.OID{}) || !validBranch(f[2]) || f[0] != strings.ToLower(f[0]) {
			return nil, nil, nil, false
		}
		cmds = append(cmds, pushCommand{old: old, new: nu, oldHex: unzero(f[0]), ref: f[2]})
	}
}

// pktLen reads a pkt-line's length: four lower- or upper-case hex digits,
// nothing else.
func pktLen(b []byte) (int, bool) {
	n := 0
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			n = n<<4 | int(c-'0')
		case 'a' <= c && c <= 'f':
			n = n<<4 | int(c-'a'+10)
		case 'A' <= c && c <= 'F':
			n = n<<4 | int(c-'A'+10)
		default:
			return 0, false
		}
	}
	return n, len(b) == 4
}

// maxRefName and maxRefPart bound a ref's name and each of its parts:
// what a file system takes as a path and as a file name (a ref is a file
// of the cache).
const (
	maxRefName = 1000
	maxRefPart = 255
)

func validBranch(ref string) bool {
	if len(ref) > maxRefName || !branchName.MatchString(ref) || strings.Contains(ref, "..") {
		return false
	}
	for _, c := range strings.Split(ref, "/") {
		if len(c) > maxRefPart || strings.HasSuffix(c, ".lock") || strings.HasSuffix(c, ".") {
			return false
		}
	}
	return true
}

// fastReceive takes push body (a whole request, gunzipped) of vault v
// in-process if it can and answers it. Otherwise it says why it leaves
// the push to git, having written nothing to w and changed nothing but
// maybe a pack in the object store that no ref names.
func (s *Service) fastReceive(ctx context.Context, w http.ResponseWriter, v store.Vault, body []byte) (leftToGit string) {
	t0 := time.Now()
	cmds, caps, packData, ok := readCommands(body)
	if !ok {
		return "not a request of branch updates it takes"
	}
	report, sideband := false, false
	for _, c := range caps {
		switch {
		case c == "report-status" || c == "report-status-v2":
			report = true
		case c == "side-band-64k":
			sideband = true
		case strings.HasPrefix(c, "agent="):
		case !fastCaps[c]:
			return "a capability it does not speak"
		}
	}
	if !report {
		return "no report asked for"
	}
	select {
	case s.inProcessSlots <- struct{}{}:
		defer func() { <-s.inProcessSlots }()
	case <-ctx.Done():
		return "the request ended"
	}
	unlock := s.lock(v.ID)
	defer unlock()
	dir, refs, err := s.ensureRefs(ctx, v)
	if err != nil {
		return "the cache could not be brought up to the store"
	}
	added := 0
	for _, c := range cmds {
		if refs[c.ref] != c.oldHex {
			return "a stale old value"
		}
		if c.oldHex == "" {
			added++
		}
	}
	if len(refs)+added > MaxRefs {
		return "too many refs"
	}
	if err := refsConflict(refs, updatesOf(cmds)); err != nil {
		return err.Error()
	}
	repo, err := gitpack.OpenRepo(dir)
	if err != nil {
		return "the repository could not be read"
	}
	defer repo.Close()
	limit := min(s.cfg.MaxPush, fastPushBytes)
	pk, err := gitpack.Read(packData, func(o gitpack.OID) (int, []byte, bool) {
		typ, data, err := repo.Read(o, limit)
		return typ, data, err == nil
	}, gitpack.Limits{Objects: fastPushObjects, Bytes: limit})
	if err != nil {
		return "the pack: " + err.Error()
	}
	commits, ok := checkPushed(pk, repo)
	if !ok {
		return "objects it does not check"
	}
	for _, c := range cmds {
		if _, ok := commits[c.new]; !ok {
			return "an existing commit on a branch"
		}
		if c.oldHex != "" && !fastForward(commits, c.old, c.new) {
			return "not a fast-forward it sees"
		}
	}
	data, objs, err := pk.Complete()
	if err != nil {
		return "completing the pack: " + err.Error()
	}
	name := "pack-" + gitpack.Name(data) + ".pack"
	t1 := time.Now()
	if err := s.putPack(ctx, v, name, data); err != nil {
		s.log.Warn("storing a push's pack", "vault", v.ID, "err", err)
		return "storing the pack: " + err.Error()
	}
	updates := updatesOf(cmds)
	if err := s.cfg.Store.UpdateVaultRefs(ctx, v.ID, updates, []string{name}); err != nil {
		return "the store refused its refs: " + err.Error() // git refuses the push, or takes it
	}
	t2 := time.Now()
	s.inProcess.Add(1)
	s.log.Info("vault push stored", "vault", v.ID, "refs", len(updates), "packs", 1, "in_process", true, "check", t1.Sub(t0), "store", t2.Sub(t1))
	status := "ok"
	if s.afterCommit != nil {
		if err := s.afterCommit(); err != nil {
			status = "ng"
		}
	}
	var rep bytes.Buffer
	pkt(&rep, "unpack ok\n")
	for _, c := range cmds {
		if status == "ok" {
			pkt(&rep, "ok "+c.ref+"\n")
		} else {
			pkt(&rep, "ng "+c.ref+" atoll: the push could not be acknowledged\n")
		}
	}
	rep.WriteString("0000")
	out := rep.Bytes()
	if sideband {
		var sb bytes.Buffer
		for r := out; len(r) > 0; {
			k := min(len(r), 65515)
			pkt(&sb, "\x01"+string(r[:k]))
			r = r[k:]
		}
		sb.WriteString("0000")
		out = sb.Bytes()
	}
	// The answer goes out whole, its length told, before the cache takes
	// the push: the pusher is done once the store has it. The cache
	// follows under the vault's lock, which the next request of the
	// vault waits for; if it fails to, that request brings it up to the
	// store.
	setPushHeaders(w.Header())
	w.Header().Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(http.StatusOK)
	w.Write(out)
	http.NewResponseController(w).Flush()
	if status == "ok" {
		if err := installPush(dir, name, data, objs, cmds); err != nil {
			s.log.Warn("installing a stored push in the cache", "vault", v.ID, "err", err)
		}
	}
	return ""
}

// checkPushed checks a push's objects as git receive-pack would (fsck
// and connectivity, given that the repository is whole): every tree's
// entries and every commit's tree and parents are in the pack or the
// repository. It returns the pack's commits, by name.
func checkPushed(pk *gitpack.Pack, repo *gitpack.Repo) (map[gitpack.OID]gitpack.CommitInfo, bool) {
	in := make(map[gitpack.OID]int, len(pk.Objects))
	for _, o := range pk.Objects {
		in[o.OID] = o.Type
	}
	// An object the push names but does not bring must be the
	// repository's, and of the type it is named as (git refuses a tree
	// entry of a file that names a tree, or a commit whose tree is a
	// blob): its type is read from its entry, once per object.
	types := map[gitpack.OID]int{}
	has := func(o gitpack.OID, typ int) bool {
		if t, ok := in[o]; ok {
			return t == typ
		}
		t, ok := types[o]
		if !ok {
			t = repo.Type(o)
			types[o] = t
		}
		return t == typ
	}
	commits := map[gitpack.OID]gitpack.CommitInfo{}
	for _, o := range pk.Objects {
		switch o.Type {
		case gitpack.Blob:
		case gitpack.Tree:
			entries, err := gitpack.ParseTree(o.Data)
			if err != nil {
				return nil, false
			}
			for _, e := range entries {
				typ := gitpack.Blob
				if e.Mode == "40000" {
					typ = gitpack.Tree
				}
				if !has(e.OID, typ) {
					return nil, false
				}
			}
		case gitpack.Commit:
			c, err := gitpack.ParseCommit(o.Data)
			if err != nil || !has(c.Tree, gitpack.Tree) {
				return nil, false
			}
			for _, p := range c.Parents {
				if !has(p, gitpack.Commit) {
					return nil, false
				}
			}
			commits[o.OID] = c
		default:
			return nil, false // a tag: git's
		}
	}
	return commits, true
}

// fastForward reports whether old is new or one of its ancestors among
// the pushed commits, or the parent of one: the push of new commits on
// top of a branch. Any other history is left to git's merge-base.
func fastForward(commits map[gitpack.OID]gitpack.CommitInfo, old, nu gitpack.OID) bool {
	seen := map[gitpack.OID]bool{}
	for next := []gitpack.OID{nu}; len(next) > 0; {
		o := next[len(next)-1]
		next = next[:len(next)-1]
		if o == old {
			return true
		}
		c, ok := commits[o]
		if !ok || seen[o] {
			continue
		}
		seen[o] = true
		next = append(next, c.Parents...)
	}
	return false
}

// putPack writes pack data to the object store as v's pack name; durable
// when it returns.
func (s *Service) putPack(ctx context.Context, v store.Vault, name string, data []byte) error {
	return s.cfg.Blob.Put(ctx, packKey(v.ID, name), func(w io.Writer) error {
		_, err := w.Write(data)
		return err
	})
}

// installPush puts a stored push's pack in the cache at dir, then its
// index (git's order: git and ensure take a pack by its index), then
// moves the branches as the push's commands say. Each file is written
// beside and renamed into place, without fsync: the cache is the store's
// copy, which ensure makes again.
func installPush(dir, name string, data []byte, objs []gitpack.Object, cmds []pushCommand) error {
	packs := filepath.Join(dir, "objects", "pack")
	idx := strings.TrimSuffix(name, ".pack") + ".idx"
	if err := renameInto(dir, filepath.Join(packs, name), data, 0o444); err != nil {
		return err
	}
	if err := renameInto(dir, filepath.Join(packs, idx), gitpack.Index(data, objs), 0o444); err != nil {
		return err
	}
	for _, c := range cmds {
		p := filepath.Join(dir, filepath.FromSlash(c.ref))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := renameInto(dir, p, []byte(c.new.String()+"\n"), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// renameInto writes data to path through a temporary file in dir, the
// repository's own directory, where neither git nor localRefs looks for
// refs or packs.
func renameInto(dir, path string, data []byte, mode os.FileMode) error {
	f, err := os.CreateTemp(dir, "incoming-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	_, err = f.Write(data)
	err = errors.Join(err, f.Chmod(mode), f.Close())
	if err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// updatesOf are cmds as the store's ref updates.
func updatesOf(cmds []pushCommand) []store.RefUpdate {
	updates := make([]store.RefUpdate, len(cmds))
	for i, c := range cmds {
		updates[i] = store.RefUpdate{Name: c.ref, Old: c.oldHex, New: c.new.String()}
	}
	return updates
}
