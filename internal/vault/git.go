package vault

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"net/http/cgi"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/httpkit"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

// Git's smart HTTP protocol is git's own: git http-backend, run as a CGI
// program on the cache repository, speaks it (protocol v0 and v2, every
// capability the stock client asks for). What this package adds is around
// it: which requests reach it (gitRoutes), who may push what (the hook
// calls receive), and the order that makes a push durable before git
// acknowledges it.

// gitRoutes are the requests of the smart protocol; nothing else (the
// dumb protocol's object paths among them) reaches git http-backend.
var gitRoutes = []struct {
	method, rest, service string
	limit                 int64 // request body bytes at most; 0: Config.MaxPush and some
}{
	{"GET", "info/refs", "", 0},
	{"POST", "git-upload-pack", "git-upload-pack", 16 << 20},
	{"POST", "git-receive-pack", "git-receive-pack", 0},
}

// push is a push under way: what the hook's request is checked against.
type push struct {
	vault store.Vault
	dir   string
	admin bool
	// unlock releases the vault's lock, which the hook took (guarded by
	// Service.mu).
	unlock func()
}

// ServeGit serves rest (what follows /git/<name>.git/) of vault name's
// git URL, for the context's tenant; the caller has authenticated the
// request.
func (s *Service) ServeGit(w http.ResponseWriter, r *http.Request, name, rest string) {
	fail := func(err error) {
		httpkit.Atoll.Error(w, httpkit.Atoll.Status(err), errdefs.Code(err), httpkit.ClientMessage(err, errdefs.Kind(err)))
	}
	var service string
	var limit int64 = -1
	for _, rt := range gitRoutes {
		if rt.method == r.Method && rt.rest == rest {
			service, limit = rt.service, rt.limit
			if limit == 0 {
				// Room for the commands around the pack: a pack over
				// MaxPush is then refused by git itself
				// (receive.maxInputSize), with a message that says so.
				limit = s.cfg.MaxPush + 1<<20
			}
		}
	}
	if limit < 0 {
		fail(fmt.Errorf("%w: no git route %s %s (this server speaks git's smart HTTP protocol only)", errdefs.ErrNotFound, r.Method, rest))
		return
	}
	if rest == "info/refs" {
		service = r.URL.Query().Get("service")
		if service != "git-upload-pack" && service != "git-receive-pack" {
			fail(fmt.Errorf("%w: info/refs needs ?service=git-upload-pack or git-receive-pack (the dumb protocol is not served)", errdefs.ErrInvalid))
			return
		}
	}
	v, err := s.lookup(r.Context(), name)
	if err != nil {
		fail(err)
		return
	}
	if r.ContentLength > limit {
		fail(fmt.Errorf("%w: the request body is larger than %d bytes", errdefs.ErrTooLarge, limit))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)

	// The cache is brought up to the store under the vault's lock; a push
	// takes it again in its hook, before it commits to the store, and
	// holds it until git has moved its own refs (see lock).
	unlock := s.lock(v.ID)
	dir, refs, err := s.ensureRefs(r.Context(), v)
	unlock()
	if err != nil {
		s.log.Error("bringing a vault's cache up to the store", "vault", v.ID, "err", err)
		fail(fmt.Errorf("%w: vault %s cannot be read now", errdefs.ErrUnavailable, v.Name))
		return
	}
	if rest == "info/refs" && s.adverts.serve(w, r, v.ID, refs) {
		return
	}
	env := append(s.gitEnv(),
		"GIT_PROJECT_ROOT="+s.cfg.Dir,
		"GIT_HTTP_EXPORT_ALL=1",
		"REMOTE_USER="+v.Tenant,
	)
	if service == "git-receive-pack" && r.Method == "POST" {
		token := newID() + newID()
		p := &push{vault: v, dir: dir, admin: tenant.IsAdmin(tenant.Of(r.Context()))}
		s.mu.Lock()
		s.pushes[token] = p
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.pushes, token)
			unlock := p.unlock
			s.mu.Unlock()
			if unlock != nil {
				unlock()
			}
		}()
		env = append(env, "ATOLL_VAULT_HOOK="+s.ln.Addr().String(), "ATOLL_VAULT_PUSH="+token)
	}
	if service == "git-receive-pack" && r.Method == "POST" {
		s.receivePack(w, r, v, dir, env)
		s.indexSoon(v)  // the index follows the push, not waited for
		s.layersSoon(v) // and the layers of mounts of its new head
		s.packsSoon(v)  // and, past consolidateAt packs, one pack of them
		return
	}
	// git http-backend sees the cache repository's path and none of the
	// client's credentials.
	cr := r.Clone(r.Context())
	cr.URL.Path = "/" + v.ID + ".git/" + rest
	cr.Header.Del("Authorization")
	cr.Header.Del("X-Api-Key")
	// git http-backend is never told a CONTENT_LENGTH: it reads the body
	// to its end instead. Told one, it loops for ever on a standard input
	// that ends short of it (a client gone mid-push, a lying header, or
	// this server killed), spinning a core and holding this handler.
	// net/http/cgi refuses chunked bodies, which git sends for any push
	// over its postBuffer; to git the body is the same either way.
	cr.TransferEncoding = nil
	cr.ContentLength = -1
	cr.Header.Del("Content-Length")
	h := &cgi.Handler{Path: s.backend, Args: s.backendArgs, Dir: s.cfg.Dir, Env: env, Stderr: logWriter{s, v.ID}}
	if rest != "info/refs" {
		h.ServeHTTP(w, cr)
		return
	}
	// A ref advertisement is kept, to be served again while the refs are
	// the same (adverts).
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, cr)
	// Kept only if the refs did not move while git read them: the
	// advertisement is then of refs.
	if after, err := s.localRefs(r.Context(), dir); err == nil && maps.Equal(after, refs) {
		s.adverts.put(r, v.ID, refs, rec)
	}
	for k, vs := range rec.Header() {
		w.Header()[k] = vs
	}
	w.WriteHeader(rec.Code)
	w.Write(rec.Body.Bytes())
}

// receivePack runs git receive-pack on a push's request, as git
// http-backend would (its service_rpc): the same headers, the body
// gunzipped if it comes so, the Git-Protocol header passed on. Run
// directly rather than through http-backend: a process less on every
// push, the costly part of it on a busy machine (docs/benchmarks.md).
func (s *Service) receivePack(w http.ResponseWriter, r *http.Request, v store.Vault, dir string, env []string) {
	if ct := r.Header.Get("Content-Type"); ct != "application/x-git-receive-pack-request" {
		httpkit.Atoll.Error(w, http.StatusUnsupportedMediaType, "invalid", "a push's Content-Type is application/x-git-receive-pack-request")
		return
	}
	body := io.Reader(r.Body)
	switch r.Header.Get("Content-Encoding") {
	case "", "identity":
	case "gzip", "x-gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			httpkit.Atoll.Error(w, http.StatusBadRequest, "invalid", "the push's gzip body does not start as gzip")
			return
		}
		// Bounded as the raw body is: a pack past MaxPush is refused by
		// git (receive.maxInputSize) either way.
		body = io.LimitReader(zr, s.cfg.MaxPush+1<<20)
	default:
		httpkit.Atoll.Error(w, http.StatusUnsupportedMediaType, "invalid", "a push's Content-Encoding is gzip or none")
		return
	}
	if p := r.Header.Get("Git-Protocol"); p != "" && gitProtocol.MatchString(p) {
		env = append(env, "GIT_PROTOCOL="+p)
	}
	// A small push is taken in-process if it can be (fastpush.go); what
	// was read of it goes to git otherwise.
	most := min(fastPushMax, s.cfg.MaxPush)
	head, err := io.ReadAll(io.LimitReader(body, most+1))
	if err != nil {
		httpkit.Atoll.Error(w, http.StatusBadRequest, "invalid", "the push's body could not be read")
		return
	}
	if int64(len(head)) <= most {
		why := s.fastReceive(r.Context(), w, v, head)
		if why == "" {
			return
		}
		s.log.Debug("a push left to git receive-pack", "vault", v.ID, "why", why)
	}
	body = io.MultiReader(bytes.NewReader(head), body)
	setPushHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	cmd := s.command(r.Context(), dir, env, "receive-pack", "--stateless-rpc", ".")
	cmd.Stdin = body
	cmd.Stdout = flushWriter{w, http.NewResponseController(w)}
	cmd.Stderr = logWriter{s, v.ID}
	if err := cmd.Run(); err != nil && r.Context().Err() == nil {
		s.log.Warn("git receive-pack", "vault", v.ID, "err", err)
	}
}

// setPushHeaders sets the headers of an answer to a push, as git
// http-backend sets them.
func setPushHeaders(h http.Header) {
	h.Set("Expires", "Fri, 01 Jan 1980 00:00:00 GMT")
	h.Set("Pragma", "no-cache")
	h.Set("Cache-Control", "no-cache, max-age=0, must-revalidate")
	h.Set("Content-Type", "application/x-git-receive-pack-result")
}

// gitProtocol is what the Git-Protocol header may carry: git's
// "version=2" and the like, nothing an environment variable should not.
var gitProtocol = regexp.MustCompile(`^[A-Za-z0-9=:._-]{1,100}$`)

// flushWriter sends what git writes at once: its progress and report
// reach the pusher as they come.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(p []byte) (int, error) {
	n, err := f.w.Write(p)
	if err == nil {
		f.rc.Flush()
	}
	return n, err
}

// logWriter logs what git http-backend writes to its standard error.
type logWriter struct {
	s  *Service
	id string
}

func (l logWriter) Write(p []byte) (int, error) {
	l.s.log.Warn("git http-backend", "vault", l.id, "stderr", strings.TrimSpace(string(p)))
	return len(p), nil
}

// hookRequest is what the hook sends: the push's token, git's quarantine
// directory (the received objects, not yet in the repository) and the
// ref updates as pre-receive reads them.
type hookRequest struct {
	Token      string
	Quarantine string
	Updates    []refUpdate
}

type refUpdate struct {
	Old, New, Ref string
}

// The hook's protocol, lines of text (the hook is a shell script, see
// hookScript): the hook sends the token, the quarantine path, git's
// "old new ref" lines, and an empty line; the server answers "ok" or
// "refused", then a message for the pusher, and closes.
const (
	maxHookLine  = 4096
	maxHookLines = 2 * MaxRefs
)

func readHookRequest(r *bufio.Reader) (hookRequest, error) {
	var req hookRequest
	next := func() (string, error) {
		l, err := r.ReadString('\n')
		if len(l) > maxHookLine {
			return "", errors.New("hook line too long")
		}
		return strings.TrimSuffix(l, "\n"), err
	}
	var err error
	if req.Token, err = next(); err != nil {
		return req, err
	}
	if req.Quarantine, err = next(); err != nil {
		return req, err
	}
	for range maxHookLines {
		l, err := next()
		if err != nil {
			return req, err
		}
		if l == "" {
			return req, nil
		}
		f := strings.Fields(l)
		if len(f) != 3 {
			return req, fmt.Errorf("malformed hook line %.80q", l)
		}
		req.Updates = append(req.Updates, refUpdate{Old: f[0], New: f[1], Ref: f[2]})
	}
	return req, fmt.Errorf("%w: atoll: a push updates %d refs at most", errdefs.ErrQuota, maxHookLines)
}

// listen listens for hooks on a loopback port, which bash's /dev/tcp
// reaches (sandboxes, in network namespaces of their own, do not); a
// connection without the token of a push under way is refused.
func (s *Service) listen() error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("vault: listening for hooks: %w", err)
	}
	s.ln = ln
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			if s.closed {
				s.mu.Unlock()
				c.Close()
				return
			}
			s.conns[c] = struct{}{}
			s.wg.Add(1)
			s.mu.Unlock()
			go func() {
				defer s.wg.Done()
				s.serveHook(c)
				s.mu.Lock()
				delete(s.conns, c)
				s.mu.Unlock()
			}()
		}
	}()
	return nil
}

// hookTimeout bounds the handling of one push's hook: storing its pack
// and committing its refs.
const hookTimeout = 5 * time.Minute

func (s *Service) serveHook(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(hookTimeout))
	req, err := readHookRequest(bufio.NewReader(io.LimitReader(c, 4<<20)))
	if err != nil {
		fmt.Fprintf(c, "refused\natoll: %s\n", errdefs.Message(err))
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), hookTimeout)
	defer cancel()
	if err := s.receive(ctx, req); err != nil {
		msg := errdefs.Message(err)
		if errdefs.Kind(err) == nil {
			s.log.Error("storing a push", "err", err)
			msg = "atoll: the push could not be stored; nothing was changed"
		}
		fmt.Fprintf(c, "refused\n%s\n", msg)
		return
	}
	io.WriteString(c, "ok\n")
}

// receive stores a push that git has received and checked (fsck,
// connectivity) but not yet applied: its pack to the object store, then
// its ref updates to the store in one compare-and-set transaction. An
// error refuses the push, and git then changes nothing.
func (s *Service) receive(ctx context.Context, req hookRequest) error {
	s.mu.Lock()
	p := s.pushes[req.Token]
	taken := p != nil && p.unlock != nil
	s.mu.Unlock()
	if p == nil || req.Token == "" || taken {
		return fmt.Errorf("%w: no such push under way", errdefs.ErrUnauthorized)
	}
	v := p.vault
	// From here until git has moved its refs (the request's end), the
	// cache must not be brought up to the store under git's feet.
	unlock := s.lock(v.ID)
	s.mu.Lock()
	if _, ok := s.pushes[req.Token]; !ok { // the request ended meanwhile
		s.mu.Unlock()
		unlock()
		return fmt.Errorf("%w: the push's request has ended", errdefs.ErrConflict)
	}
	p.unlock = unlock
	s.mu.Unlock()
	// git names the quarantine; it must be one inside this repository.
	var env []string
	if q := req.Quarantine; q != "" {
		if filepath.Dir(q) != filepath.Join(p.dir, "objects") || !strings.HasPrefix(filepath.Base(q), "tmp_objdir-incoming-") {
			return fmt.Errorf("%w: unexpected quarantine directory", errdefs.ErrInvalid)
		}
		env = []string{"GIT_OBJECT_DIRECTORY=" + q, "GIT_ALTERNATE_OBJECT_DIRECTORIES=" + filepath.Join(p.dir, "objects")}
	}
	refs, _, err := s.cfg.Store.VaultState(ctx, v.ID)
	if err != nil {
		return err
	}
	n := len(refs)
	var updates []store.RefUpdate
	for _, u := range req.Updates {
		old, nu := unzero(u.Old), unzero(u.New)
		if !strings.HasPrefix(u.Ref, "refs/heads/") && !strings.HasPrefix(u.Ref, "refs/tags/") {
			return fmt.Errorf("%w: atoll: %s: a vault takes branches (refs/heads/) and tags (refs/tags/) only", errdefs.ErrInvalid, u.Ref)
		}
		if old == "" && nu != "" {
			if n++; n > MaxRefs {
				return fmt.Errorf("%w: atoll: a vault holds %d refs at most", errdefs.ErrQuota, MaxRefs)
			}
		}
		rewrite := ""
		switch {
		case nu == "":
			rewrite = "deleting " + u.Ref
		case old != "" && strings.HasPrefix(u.Ref, "refs/tags/"):
			rewrite = "moving tag " + u.Ref
		case old != "":
			ff := false
			if parents, ok := quarantineParents(req.Quarantine, nu); ok && slices.Contains(parents, old) {
				ff = true // the common push: no git process for it
			} else if ff, err = s.isAncestor(ctx, p.dir, env, old, nu); err != nil {
				return err
			}
			if !ff {
				rewrite = "a non-fast-forward update of " + u.Ref
			}
		}
		if rewrite != "" && !(p.admin && v.AllowRewrite) {
			return fmt.Errorf("%w: atoll: refusing %s: a vault's history is append-only (only an admin key may rewrite it, and only in a vault made with --allow-rewrite); pull, merge and push again", errdefs.ErrConflict, rewrite)
		}
		updates = append(updates, store.RefUpdate{Name: u.Ref, Old: old, New: nu})
	}
	if err := refsConflict(refs, updates); err != nil {
		return err
	}
	var packs []string
	if req.Quarantine != "" {
		if loose, _ := filepath.Glob(filepath.Join(req.Quarantine, "[0-9a-f][0-9a-f]")); len(loose) > 0 {
			// receive.unpackLimit = 1 makes git keep every push as a pack.
			return errors.New("the push arrived as loose objects, not a pack")
		}
		files, _ := filepath.Glob(filepath.Join(req.Quarantine, "pack", "pack-*.pack"))
		for _, f := range files {
			name, err := s.storePack(ctx, v, f)
			if err != nil {
				return fmt.Errorf("storing vault %s's pack: %w", v.ID, err)
			}
			packs = append(packs, name)
		}
	}
	if err := s.cfg.Store.UpdateVaultRefs(ctx, v.ID, updates, packs); err != nil {
		if errors.Is(err, errdefs.ErrConflict) {
			return fmt.Errorf("%w: atoll: the vault moved meanwhile (%v); fetch, merge and push again", errdefs.ErrConflict, errdefs.Message(err))
		}
		return err
	}
	s.log.Info("vault push stored", "vault", v.ID, "refs", len(updates), "packs", len(packs))
	if s.afterCommit != nil {
		return s.afterCommit()
	}
	return nil
}

// isAncestor reports whether commit old is an ancestor of new: whether
// moving a branch from old to new loses nothing.
func (s *Service) isAncestor(ctx context.Context, dir string, env []string, old, nu string) (bool, error) {
	_, err := s.run(ctx, dir, env, nil, "merge-base", "--is-ancestor", old, nu)
	var ge *gitError
	switch {
	case err == nil:
		return true, nil
	case errors.As(err, &ge) && ge.code == 1:
		return false, nil
	}
	return false, err
}

// unzero is "" for git's null object ID.
func unzero(oid string) string {
	if strings.Trim(oid, "0") == "" {
		return ""
	}
	return oid
}

// refsConflict refuses ref updates that would leave refs git cannot keep
// as files side by side: a ref whose name is a directory of another's
// (refs/heads/main and refs/heads/main/x), or a name or a part of one
// longer than a file system takes. Stored, such a ref could never be set
// in a cache, and every request of the vault would fail.
func refsConflict(refs map[string]string, updates []store.RefUpdate) error {
	names := maps.Clone(refs)
	if names == nil {
		names = map[string]string{}
	}
	for _, u := range updates {
		if u.New == "" {
			delete(names, u.Name)
			continue
		}
		if len(u.Name) > maxRefName {
			return fmt.Errorf("%w: atoll: a ref's name is %d bytes at most", errdefs.ErrInvalid, maxRefName)
		}
		for _, part := range strings.Split(u.Name, "/") {
			if len(part) > maxRefPart {
				return fmt.Errorf("%w: atoll: each part of a ref's name is %d bytes at most", errdefs.ErrInvalid, maxRefPart)
			}
		}
		names[u.Name] = u.New
	}
	for name := range names {
		for i := strings.IndexByte(name, '/'); i >= 0; {
			if _, ok := names[name[:i]]; ok {
				return fmt.Errorf("%w: atoll: %.200s and %.200s cannot both be refs (one would be a directory of the other); delete one first", errdefs.ErrConflict, name[:i], name)
			}
			j := strings.IndexByte(name[i+1:], '/')
			if j < 0 {
				break
			}
			i += 1 + j
		}
	}
	return nil
}
