package e2b

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/audit"
	"github.com/atoll-dev/atoll/internal/errdefs"
)

// maxTimeoutSec bounds E2B timeouts, as atoll bounds its own: one year.
const maxTimeoutSec = 365 * 24 * 60 * 60

// sandboxID returns the {sandboxID} of r. E2B IDs once carried a client
// suffix ("id-client"), which E2B still strips. A malformed ID cannot name
// a sandbox: that is E2B's 404, not a 400, so kill() of one answers false.
func sandboxID(w http.ResponseWriter, r *http.Request) (string, bool) {
	id, _, _ := strings.Cut(r.PathValue("sandboxID"), "-")
	if !api.ValidSandboxID(id) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", truncate(r.PathValue("sandboxID"))))
		return "", false
	}
	return id, true
}

// sandboxBody reads the {sandboxID} of r and r's JSON body, a T (an empty
// body leaves it zero if optional); it answers a bad request itself, and
// ok is false.
func sandboxBody[T any](s *Server, w http.ResponseWriter, r *http.Request, optional bool) (id string, body T, ok bool) {
	if id, ok = sandboxID(w, r); !ok {
		return "", body, false
	}
	if err := decode(w, r, &body, optional); err != nil {
		s.writeErr(w, r, err)
		return "", body, false
	}
	return id, body, true
}

// timedBody is sandboxBody for a body with E2B's timeout (optional: an
// empty body is allowed), which it reads too: def if it is absent.
func timedBody[T timed](s *Server, w http.ResponseWriter, r *http.Request, def int64) (id string, body T, t int64, ok bool) {
	if id, body, ok = sandboxBody[T](s, w, r, true); !ok {
		return "", body, 0, false
	}
	t, err := timeoutSec(body.timeout(), def)
	if err != nil {
		s.writeErr(w, r, err)
		return "", body, 0, false
	}
	return id, body, t, true
}

func truncate(s string) string {
	if len(s) > 64 {
		s = s[:64] + "…"
	}
	return strings.ToValidUTF8(s, "?")
}

// sandboxErr answers an error about sandbox id; not found in E2B's words.
func (s *Server) sandboxErr(w http.ResponseWriter, r *http.Request, id string, err error) {
	if errors.Is(err, errdefs.ErrNotFound) {
		writeError(w, http.StatusNotFound, fmt.Sprintf("sandbox %q not found", id))
		return
	}
	s.writeErr(w, r, err)
}

// visible gets a sandbox E2B can see: deleting and failed ones are gone.
func (s *Server) visible(ctx context.Context, id string) (api.Sandbox, error) {
	sb, err := s.cfg.Sandboxes.Get(ctx, id)
	if err == nil {
		if _, ok := e2bState(sb.State); !ok {
			err = fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
		}
	}
	return sb, err
}

func timeoutSec(t *int64, def int64) (int64, error) {
	if t == nil {
		return def, nil
	}
	if *t < 0 || *t > maxTimeoutSec {
		return 0, bad("timeout %d: want 0 to %d seconds", *t, maxTimeoutSec)
	}
	return *t, nil
}

// create answers POST /sandboxes (default timeout 15 s) and POST
// /v2/sandboxes (300 s), E2B's defaults.
func (s *Server) create(defaultTimeout int64) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var body newSandbox
		if err := decode(w, r, &body, false); err != nil {
			s.writeErr(w, r, err)
			return
		}
		req, alias, err := s.createRequest(r.Context(), body, defaultTimeout)
		if err != nil {
			s.writeErr(w, r, err)
			return
		}
		sb, err := s.cfg.Sandboxes.Create(r.Context(), req)
		if err != nil {
			if errors.Is(err, errdefs.ErrNotFound) {
				writeError(w, http.StatusNotFound, fmt.Sprintf("template '%s' not found", truncate(body.TemplateID)))
				return
			}
			s.writeErr(w, r, err)
			return
		}
		audit.SetTarget(r.Context(), sb.ID)
		out := s.sandbox(sb)
		if alias != "" {
			out.Alias = alias
		}
		writeJSON(w, http.StatusCreated, out)
	}
}

// createRequest maps E2B's create body onto atoll's, refusing what atoll
// cannot do rather than ignoring it.
func (s *Server) createRequest(ctx context.Context, b newSandbox, defaultTimeout int64) (api.CreateSandboxRequest, string, error) {
	var req api.CreateSandboxRequest
	switch {
	case b.TemplateID == "":
		return req, "", bad("templateID is required")
	case !isNull(b.MCP):
		return req, "", bad("mcp: MCP gateways are not supported")
	case !isNull(b.IAM) && string(b.IAM) != "{}":
		return req, "", bad("iam: workload identity is not supported")
	case len(b.VolumeMounts) > 0:
		return req, "", bad("volumeMounts: volumes are not supported")
	}
	autoResume := b.AutoResume != nil && b.AutoResume.Enabled
	switch {
	case autoResume && (b.AutoPause == nil || !*b.AutoPause):
		return req, "", bad("autoResume: only a sandbox that pauses on timeout (autoPause) can resume on traffic")
	case autoResume && b.AutoPauseMemory != nil && !*b.AutoPauseMemory:
		return req, "", bad("autoResume: a sandbox paused without memory cannot resume on traffic; connect to it instead")
	}
	t, err := timeoutSec(b.Timeout, defaultTimeout)
	if err != nil {
		return req, "", err
	}
	if err := checkMetadata(b.Metadata); err != nil {
		return req, "", err
	}
	allowInternet := b.AllowInternetAccess
	if allowInternet == nil {
		allowInternet = b.AllowInternetAccessCamel
	}
	var allowOut, denyOut []string
	public := true // E2B's default: sandbox URLs open to anyone who has them
	if n := b.Network; n != nil {
		if err := unsupportedEgress(n.EgressProxy, n.Rules); err != nil {
			return req, "", err
		}
		if n.MaskRequestHost != nil && *n.MaskRequestHost != "" {
			return req, "", bad("network.maskRequestHost: rewriting the Host of requests to sandboxes is not supported by atoll")
		}
		if len(n.HTTPSPorts) > 0 {
			return req, "", bad("network.httpsPorts: atoll reaches sandbox ports over plain HTTP only")
		}
		allowOut, denyOut = n.AllowOut, n.DenyOut
		if n.AllowPublicTraffic != nil {
			public = *n.AllowPublicTraffic
		}
	}
	policy, err := egressPolicy(allowInternet, allowOut, denyOut)
	if err != nil {
		return req, "", err
	}
	tmpl, snap, alias, err := s.source(ctx, b.TemplateID)
	if err != nil {
		return req, "", err
	}
	req = api.CreateSandboxRequest{
		Template: tmpl, Snapshot: snap, Env: b.EnvVars, Labels: b.Metadata, TimeoutSec: t,
		Network: policy, Ports: &api.PortAccess{Public: public},
		// E2B kills a sandbox on timeout unless it auto-pauses; atoll's
		// timeout stops it, so a killing one is ephemeral. An auto-pausing
		// one stops with its files kept and shows as paused.
		Ephemeral: b.AutoPause == nil || !*b.AutoPause,
		// Traffic to its ports or envd wakes it, and its timeout pauses it
		// (memory kept) rather than stopping it.
		AutoResume: autoResume,
	}
	return req, alias, nil
}

func isNull(m []byte) bool { return len(m) == 0 || string(m) == "null" }

// checkMetadata holds E2B metadata to atoll's label rules, with E2B's
// words in the error.
func checkMetadata(md map[string]string) error {
	if len(md) > 64 {
		return bad("metadata: at most 64 keys")
	}
	for k, v := range md {
		if k == "" || len(k) > 63 || strings.Trim(k, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._/-") != "" {
			return bad("metadata key %q: keys are 1-63 characters of [A-Za-z0-9._/-] on atoll", truncate(k))
		}
		if len(v) > 256 || !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
			return bad("metadata value of %q: values are at most 256 bytes of UTF-8 without NUL on atoll", truncate(k))
		}
	}
	return nil
}

// source resolves E2B's templateID: an alias ("base"), a snapshot ID or
// name (E2B creates sandboxes from snapshots by naming them as the
// template), or an atoll template name. E2B's tags name a template's
// builds, as atoll's versions and names do: NAME:VERSION (a version number
// or ID) is atoll's NAME@VERSION, :default or :latest the version the name
// points to, and another tag the atoll template NAME.TAG (atollRef).
func (s *Server) source(ctx context.Context, id string) (tmpl, snap, alias string, err error) {
	name, tag, hasTag := strings.Cut(id, ":")
	if hasTag && (tag == "default" || tag == "latest") {
		hasTag = false
	}
	if ts, ok := s.cfg.Aliases[name]; ok {
		if hasTag {
			return "", "", "", fmt.Errorf("template '%s' not found: %w", truncate(id), errdefs.ErrNotFound)
		}
		t, err := s.aliased(ctx, ts)
		return t, "", name, err
	}
	if hasTag {
		if !e2bTagPattern.MatchString(tag) {
			return "", "", "", fmt.Errorf("template '%s': the tag is not a valid tag: %w", truncate(id), errdefs.ErrInvalid)
		}
		return atollRef(name, tag), "", "", nil
	}
	if api.ValidSandboxID(name) {
		if _, err := s.cfg.Sandboxes.GetSnapshot(ctx, name); err == nil {
			return "", name, "", nil
		} else if !errors.Is(err, errdefs.ErrNotFound) {
			return "", "", "", err
		}
	}
	snaps, err := s.cfg.Sandboxes.ListSnapshots(ctx, "")
	if err != nil {
		return "", "", "", err
	}
	for _, sn := range snaps {
		if sn.Name != "" && sn.Name == name {
			return "", sn.ID, "", nil
		}
	}
	return name, "", "", nil
}

// aliased is the first of an alias's templates that exists, or its last.
func (s *Server) aliased(ctx context.Context, tmpls []string) (string, error) {
	for _, t := range tmpls[:len(tmpls)-1] {
		if s.cfg.Templates == nil {
			return t, nil
		}
		// A removed name is listed while sandboxes hold its versions,
		// but creates nothing.
		tmpl, err := s.cfg.Templates.Get(ctx, t)
		if err == nil && !tmpl.Removed {
			return t, nil
		}
		if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
			return "", err
		}
	}
	return tmpls[len(tmpls)-1], nil
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	sb, err := s.visible(r.Context(), id)
	if err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	writeJSON(w, http.StatusOK, s.detail(sb))
}

func (s *Server) kill(w http.ResponseWriter, r *http.Request) {
	id, ok := sandboxID(w, r)
	if !ok {
		return
	}
	if err := s.cfg.Sandboxes.Delete(r.Context(), id); err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// running gets a sandbox that must be running for E2B: others are not
// found, as E2B's paused sandboxes are not in its running store.
func (s *Server) running(w http.ResponseWriter, r *http.Request, id string) (api.Sandbox, bool) {
	sb, err := s.cfg.Sandboxes.Get(r.Context(), id)
	if err == nil && sb.State != api.StateRunning {
		err = fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	if err != nil {
		s.sandboxErr(w, r, id, err)
		return sb, false
	}
	return sb, true
}

func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	id, body, ok := sandboxBody[timeoutRequest](s, w, r, false)
	if !ok {
		return
	}
	if body.Timeout == nil {
		s.writeErr(w, r, bad("timeout is required"))
		return
	}
	t, err := timeoutSec(body.Timeout, 0)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	if _, ok := s.running(w, r, id); !ok {
		return
	}
	if _, err := s.cfg.Sandboxes.SetTimeout(r.Context(), id, api.TimeoutRequest{TimeoutSec: t}); err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// extend moves a running sandbox's end to sec from now if that is later:
// E2B's connect and refresh only ever extend.
func (s *Server) extend(ctx context.Context, sb api.Sandbox, sec int64) error {
	if sb.ExpiresAt == nil || !time.Now().Add(time.Duration(sec)*time.Second).After(*sb.ExpiresAt) {
		return nil // no timeout to extend, or it ends later already
	}
	_, err := s.cfg.Sandboxes.SetTimeout(ctx, sb.ID, api.TimeoutRequest{TimeoutSec: sec})
	return err
}

func (s *Server) refresh(w http.ResponseWriter, r *http.Request) {
	id, body, ok := sandboxBody[refreshRequest](s, w, r, true)
	if !ok {
		return
	}
	if body.Duration < 0 || body.Duration > 3600 {
		s.writeErr(w, r, bad("duration %d: want 0 to 3600 seconds", body.Duration))
		return
	}
	sb, ok := s.running(w, r, id)
	if !ok {
		return
	}
	if err := s.extend(r.Context(), sb, body.Duration); err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// pause freezes a running sandbox, memory and all, or with {"memory":
// false} (the SDK's keepMemory) shelves it: its processes end, its files
// stay, and connect boots it again. E2B's paused sandboxes never time out,
// so the timeout goes (connect sets a new one); otherwise a killing
// sandbox would be deleted while paused.
func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	id, body, ok := sandboxBody[pauseRequest](s, w, r, true)
	if !ok {
		return
	}
	sb, err := s.visible(r.Context(), id)
	if err == nil && sb.State != api.StateRunning {
		err = fmt.Errorf("%w: sandbox %s is already paused", errdefs.ErrConflict, id)
	}
	if err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	// An auto-resume sandbox keeps its timeout_sec, for traffic that wakes
	// it; pausing it drops only when the timeout falls due.
	if !sb.AutoResume {
		if _, err := s.cfg.Sandboxes.SetTimeout(r.Context(), id, api.TimeoutRequest{}); err != nil {
			s.sandboxErr(w, r, id, err)
			return
		}
	}
	pause := s.cfg.Sandboxes.Pause
	if body.Memory != nil && !*body.Memory {
		pause = s.cfg.Sandboxes.Shelve
	}
	if _, err := pause(r.Context(), id); err != nil {
		if sb.ExpiresAt != nil { // put the timeout back, rounded up
			left := max(1, int64(time.Until(*sb.ExpiresAt)/time.Second)+1)
			s.cfg.Sandboxes.SetTimeout(context.WithoutCancel(r.Context()), id, api.TimeoutRequest{TimeoutSec: left})
		}
		s.sandboxErr(w, r, id, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// settleTimeout bounds how long connect waits for a sandbox that is
// changing state (stopping on its timeout, archiving) to settle, as E2B's
// connect waits for one.
const settleTimeout = 30 * time.Second

// settled gets sandbox id once it is not changing state.
func (s *Server) settled(ctx context.Context, id string) (api.Sandbox, error) {
	deadline := time.Now().Add(settleTimeout)
	for {
		sb, err := s.visible(ctx, id)
		if err != nil {
			return sb, err
		}
		switch sb.State {
		case api.StateCreating, api.StateStarting, api.StateStopping, api.StateArchiving:
		default:
			return sb, nil
		}
		if time.Now().After(deadline) {
			return sb, fmt.Errorf("%w: sandbox %s is still %s; try again", errdefs.ErrConflict, id, sb.State)
		}
		select {
		case <-ctx.Done():
			return sb, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// wake brings a sandbox E2B sees as paused back: resumes a paused,
// suspended or shelved one, starts a stopped or archived one (its
// processes are gone then, as a shelved one's are).
func (s *Server) wake(ctx context.Context, sb api.Sandbox) (api.Sandbox, error) {
	switch sb.State {
	case api.StatePaused, api.StateSuspended, api.StateShelved:
		return s.cfg.Sandboxes.Resume(ctx, sb.ID)
	case api.StateStopped, api.StateArchived:
		return s.cfg.Sandboxes.Start(ctx, sb.ID)
	}
	return sb, fmt.Errorf("%w: sandbox %s is %s; try again", errdefs.ErrConflict, sb.ID, sb.State)
}

// resume is E2B's deprecated POST /sandboxes/{id}/resume: 409 unless paused.
func (s *Server) resume(w http.ResponseWriter, r *http.Request) { s.wakeUp(w, r, 15, false) }

// connect answers both connect routes: a running sandbox's timeout is only
// ever extended (200); a paused one is woken with the timeout (201).
func (s *Server) connect(w http.ResponseWriter, r *http.Request) { s.wakeUp(w, r, 300, true) }

// wakeUp wakes a paused sandbox with the request's timeout (def if it has
// none) and answers 201. A running one is a conflict, but for connect,
// which only ever extends its timeout and answers 200.
func (s *Server) wakeUp(w http.ResponseWriter, r *http.Request, def int64, connect bool) {
	id, _, t, ok := timedBody[connectRequest](s, w, r, def)
	if !ok {
		return
	}
	sb, err := s.settled(r.Context(), id)
	if err == nil && sb.State == api.StateRunning {
		if !connect {
			err = fmt.Errorf("%w: sandbox %s is already running", errdefs.ErrConflict, id)
		} else if err = s.extend(r.Context(), sb, t); err == nil {
			writeJSON(w, http.StatusOK, s.sandbox(sb))
			return
		}
	}
	if err == nil {
		sb, err = s.wake(r.Context(), sb)
	}
	if err == nil {
		sb, err = s.cfg.Sandboxes.SetTimeout(r.Context(), id, api.TimeoutRequest{TimeoutSec: t})
	}
	if err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	writeJSON(w, http.StatusCreated, s.sandbox(sb))
}

// fork creates count sandboxes from a sandbox's current files. E2B's forks
// carry the parent's memory; this one asks for a files-only fork
// (api.ForkRequest.Memory unset), so the children start fresh processes on
// every runtime, including those whose memory forks atoll's own API offers
// (capability memory_fork).
func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	id, body, t, ok := timedBody[forkRequest](s, w, r, 15)
	if !ok {
		return
	}
	count := 1
	if body.Count != nil {
		count = *body.Count
	}
	if count < 1 || count > 100 {
		s.writeErr(w, r, bad("count %d: want 1 to 100", count))
		return
	}
	if _, err := s.visible(r.Context(), id); err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	kids, err := s.cfg.Sandboxes.Fork(r.Context(), id, api.ForkRequest{Count: count})
	if err != nil {
		s.sandboxErr(w, r, id, err)
		return
	}
	out := make([]forkResult, 0, len(kids))
	for _, k := range kids {
		if k, err = s.cfg.Sandboxes.SetTimeout(r.Context(), k.ID, api.TimeoutRequest{TimeoutSec: t}); err != nil {
			status, msg := http.StatusInternalServerError, "setting the fork's timeout failed"
			if kind := errdefs.Kind(err); kind != nil {
				status, msg = errdefs.Status(err), clientMessage(err, kind)
			}
			out = append(out, forkResult{Error: &apiError{Code: status, Message: msg}})
			continue
		}
		out = append(out, forkResult{Sandbox: s.sandbox(k)})
	}
	writeJSON(w, http.StatusCreated, out)
}

// listV1 is the deprecated GET /sandboxes: running sandboxes, one page.
func (s *Server) listV1(w http.ResponseWriter, r *http.Request) {
	md, err := metadataFilter(r.URL.Query().Get("metadata"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	sbs, err := s.cfg.Sandboxes.List(r.Context(), api.StateRunning, md)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	out := make([]listedSandbox, 0, len(sbs))
	for _, sb := range sbs {
		out = append(out, s.listed(sb))
	}
	writeJSON(w, http.StatusOK, out)
}

// metadataFilter parses E2B's metadata query: a query string of its own
// ("k=v&k2=v2"), each key and value URL-encoded once more by the SDKs.
func metadataFilter(q string) (map[string]string, error) {
	if q == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(q)
	if err != nil {
		return nil, bad("metadata filter %q: %v", truncate(q), err)
	}
	md := map[string]string{}
	for k, vs := range vals {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(vs[len(vs)-1])
		if err1 != nil || err2 != nil {
			return nil, bad("metadata filter %q: bad escape", truncate(q))
		}
		md[key] = val
	}
	return md, nil
}

// list is GET /v2/sandboxes: filtered by metadata, state, start time and
// template, sorted by start time, paginated with X-Next-Token.
func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	md, err := metadataFilter(q.Get("metadata"))
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	states := map[string]bool{}
	for _, v := range q["state"] {
		for _, st := range strings.Split(v, ",") {
			if st != stateRunning && st != statePaused {
				s.writeErr(w, r, bad("state %q: want running or paused", truncate(st)))
				return
			}
			states[st] = true
		}
	}
	if len(states) == 0 {
		states[stateRunning], states[statePaused] = true, true
	}
	order := q.Get("order")
	if order == "" {
		order = "desc"
	}
	if order != "asc" && order != "desc" {
		s.writeErr(w, r, bad("order %q: want asc or desc", truncate(order)))
		return
	}
	var after time.Time
	if v := q.Get("startedAfter"); v != "" {
		if after, err = time.Parse(time.RFC3339Nano, v); err != nil {
			s.writeErr(w, r, bad("startedAfter %q: want an RFC 3339 time", truncate(v)))
			return
		}
	}
	limit, cur, err := pageOf(q)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	template := q.Get("template")
	sbs, err := s.cfg.Sandboxes.List(r.Context(), "", md)
	if err != nil {
		s.writeErr(w, r, err)
		return
	}
	var items []listedSandbox
	running := 0
	for _, sb := range sbs {
		l := s.listed(sb)
		if st, ok := e2bState(sb.State); !ok || !states[st] || l.StartedAt.Before(after) ||
			template != "" && template != l.TemplateID && template != l.Alias {
			continue
		}
		if l.State == stateRunning {
			running++
		}
		items = append(items, l)
	}
	desc := order == "desc"
	less := func(a, b cursor) bool { // strict: the cursor's own item is not after it
		if !a.t.Equal(b.t) {
			return a.t.Before(b.t) != desc
		}
		return a.id != b.id && a.id < b.id != desc
	}
	sort.Slice(items, func(i, j int) bool { return less(cursorOf(items[i]), cursorOf(items[j])) })
	if cur != nil {
		i := sort.Search(len(items), func(i int) bool { return less(*cur, cursorOf(items[i])) })
		items = items[i:]
	}
	if len(items) > limit {
		items = items[:limit]
		w.Header().Set("X-Next-Token", cursorOf(items[limit-1]).String())
	}
	if states[stateRunning] {
		w.Header().Set("X-Total-Running", strconv.Itoa(running))
	}
	if items == nil {
		items = []listedSandbox{}
	}
	writeJSON(w, http.StatusOK, items)
}

// cursor is a position in a sorted listing: the last item's sort key.
type cursor struct {
	t  time.Time
	id string
}

func cursorOf(l listedSandbox) cursor { return cursor{l.StartedAt, l.SandboxID} }

func (c cursor) String() string {
	return base64.RawURLEncoding.EncodeToString([]byte(strconv.FormatInt(c.t.UnixNano(), 10) + "." + c.id))
}

// pageOf reads the page a listing's query asks for: limit (1 to 100,
// default 100) and nextToken, the cursor to start after.
func pageOf(q url.Values) (limit int, cur *cursor, err error) {
	limit = 100
	if v := q.Get("limit"); v != "" {
		if limit, err = strconv.Atoi(v); err != nil || limit < 1 || limit > 100 {
			return 0, nil, bad("limit %q: want 1 to 100", truncate(v))
		}
	}
	if v := q.Get("nextToken"); v != "" {
		c, err := parseCursor(v)
		if err != nil {
			return 0, nil, err
		}
		cur = &c
	}
	return limit, cur, nil
}

func parseCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err == nil {
		ns, id, ok := strings.Cut(string(b), ".")
		n, perr := strconv.ParseInt(ns, 10, 64)
		if ok && perr == nil && len(id) <= 64 {
			return cursor{time.Unix(0, n).UTC(), id}, nil
		}
	}
	return cursor{}, bad("malformed nextToken")
}
