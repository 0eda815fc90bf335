package envd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/agent"
	"github.com/atoll-dev/atoll/internal/e2b/envd/spec/filesystem"
)

// filesystemService is E2B's filesystem.Filesystem over the atoll agent.
type filesystemService struct{ s *Server }

// notFound is envd's answer for a missing path (SDKs turn it into
// FileNotFoundError, and exists() into false).
func notFound(p string) error {
	return connect.NewError(connect.CodeNotFound, fmt.Errorf("path %s does not exist", p))
}

func fsError(p string, err error) error {
	if isNotFound(err) {
		return notFound(p)
	}
	return rpcError(err)
}

func (f *filesystemService) Stat(ctx context.Context, req *connect.Request[filesystem.StatRequest]) (*connect.Response[filesystem.StatResponse], error) {
	c := callFrom(ctx)
	p, err := c.resolve(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	fi, err := c.sb.Agent.StatMetadata(ctx, p)
	if err != nil {
		return nil, fsError(p, err)
	}
	return connect.NewResponse(&filesystem.StatResponse{Entry: c.entry(ctx, fi, true)}), nil
}

func (f *filesystemService) MakeDir(ctx context.Context, req *connect.Request[filesystem.MakeDirRequest]) (*connect.Response[filesystem.MakeDirResponse], error) {
	c := callFrom(ctx)
	p, err := c.resolve(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	if fi, err := c.follow(ctx, p); err == nil {
		if fi.Type == api.FileTypeDir {
			return nil, connect.NewError(connect.CodeAlreadyExists, fmt.Errorf("directory already exists: %s", p))
		}
		return nil, invalid("path already exists but it is not a directory: %s", p)
	} else if !isNotFound(err) {
		return nil, rpcError(err)
	}
	fi, err := c.sb.Agent.Mkdir(ctx, api.MkdirRequest{Path: p, User: c.user})
	if err != nil {
		return nil, fsError(p, err)
	}
	return connect.NewResponse(&filesystem.MakeDirResponse{Entry: c.entry(ctx, fi, false)}), nil
}

func (f *filesystemService) Move(ctx context.Context, req *connect.Request[filesystem.MoveRequest]) (*connect.Response[filesystem.MoveResponse], error) {
	c := callFrom(ctx)
	src, err := c.resolve(ctx, req.Msg.GetSource())
	if err != nil {
		return nil, err
	}
	dst, err := c.resolve(ctx, req.Msg.GetDestination())
	if err != nil {
		return nil, err
	}
	if _, err := c.sb.Agent.Stat(ctx, src); err != nil {
		return nil, fsError(src, err)
	}
	// envd creates the destination's parents, owned by the user.
	if dir := path.Dir(dst); dir != "/" {
		if _, err := c.sb.Agent.Mkdir(ctx, api.MkdirRequest{Path: dir, User: c.user}); err != nil {
			return nil, fsError(dir, err)
		}
	}
	fi, err := c.sb.Agent.RenameMetadata(ctx, src, dst)
	if err != nil {
		return nil, fsError(src, err)
	}
	return connect.NewResponse(&filesystem.MoveResponse{Entry: c.entry(ctx, fi, true)}), nil
}

// maxListEntries bounds one ListDir answer.
const maxListEntries = 100000

func (f *filesystemService) ListDir(ctx context.Context, req *connect.Request[filesystem.ListDirRequest]) (*connect.Response[filesystem.ListDirResponse], error) {
	c := callFrom(ctx)
	p, err := c.resolve(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	depth := int(min(req.Msg.GetDepth(), 1000))
	if depth == 0 {
		depth = 1
	}
	dir, err := c.follow(ctx, p)
	if err != nil {
		return nil, fsError(p, err)
	}
	if dir.Type != api.FileTypeDir {
		return nil, invalid("path is not a directory: %s", p)
	}
	entries := []*filesystem.EntryInfo{}
	if err := c.walk(ctx, dir.Path, depth, true, &entries); err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.ListDirResponse{Entries: entries}), nil
}

// walk lists dir and, down to depth levels, its subdirectories as envd
// does (filepath.WalkDir): depth first, each directory's entries in
// lexical order, a directory right before what it holds; links are
// listed, not followed. A directory below the top one that is removed
// while we walk is skipped.
func (c *call) walk(ctx context.Context, dir string, depth int, top bool, entries *[]*filesystem.EntryInfo) error {
	fis, err := c.sb.Agent.ListMetadata(ctx, dir)
	if isNotFound(err) && !top {
		return nil
	}
	if err != nil {
		return fsError(dir, err)
	}
	sort.Slice(fis, func(i, j int) bool { return fis[i].Name < fis[j].Name })
	for _, fi := range fis {
		if len(*entries) >= maxListEntries {
			return connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("more than %d entries; list with a smaller depth", maxListEntries))
		}
		*entries = append(*entries, c.entry(ctx, fi, false))
		if fi.Type != api.FileTypeDir || depth <= 1 {
			continue
		}
		if err := c.walk(ctx, fi.Path, depth-1, false, entries); err != nil {
			return err
		}
	}
	return nil
}

func (f *filesystemService) Remove(ctx context.Context, req *connect.Request[filesystem.RemoveRequest]) (*connect.Response[filesystem.RemoveResponse], error) {
	c := callFrom(ctx)
	p, err := c.resolve(ctx, req.Msg.GetPath())
	if err != nil {
		return nil, err
	}
	// envd removes like rm -rf: a missing path is no error.
	if err := c.sb.Agent.Remove(ctx, p, true); err != nil && !isNotFound(err) {
		return nil, rpcError(err)
	}
	return connect.NewResponse(&filesystem.RemoveResponse{}), nil
}

// watchDir checks a watch request and starts the agent's watch. Like
// envd, it refuses a directory on a network file system unless the
// request allows one.
func (c *call) watchDir(ctx, watchCtx context.Context, p string, opts agent.WatchOptions) (string, *agent.WatchStream, error) {
	p, err := c.resolve(ctx, p)
	if err != nil {
		return "", nil, err
	}
	fi, err := c.follow(ctx, p)
	if err != nil {
		return "", nil, fsError(p, err)
	}
	if fi.Type != api.FileTypeDir {
		return "", nil, invalid("path %s is not a directory", p)
	}
	ws, err := c.sb.Agent.WatchWith(watchCtx, fi.Path, opts)
	if err != nil {
		return "", nil, fsError(p, err)
	}
	return fi.Path, ws, nil
}

// watchOptions are the agent's options for an envd watch request.
func watchOptions(recursive, includeEntry, allowNetworkMounts bool) agent.WatchOptions {
	return agent.WatchOptions{Recursive: recursive, Entries: includeEntry, NoNetworkMounts: !allowNetworkMounts}
}

func (f *filesystemService) WatchDir(ctx context.Context, req *connect.Request[filesystem.WatchDirRequest], stream *connect.ServerStream[filesystem.WatchDirResponse]) error {
	c := callFrom(ctx)
	m := req.Msg
	dir, ws, err := c.watchDir(ctx, ctx, m.GetPath(), watchOptions(m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts()))
	if err != nil {
		return err
	}
	defer ws.Close()
	if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Start{Start: &filesystem.WatchDirResponse_StartEvent{}}}); err != nil {
		return err
	}
	events := make(chan api.WatchEvent)
	stopped := make(chan error, 1)
	go func() {
		var err error
		defer func() {
			stopped <- err
			close(events)
		}()
		for {
			var ev api.WatchEvent
			if ev, err = ws.Next(); err != nil {
				return
			}
			select {
			case events <- ev:
			case <-ctx.Done():
				err = ctx.Err()
				return
			}
		}
	}()
	defer func() {
		ws.Close()
		for range events { // wait for the reader
		}
	}()
	var tick <-chan time.Time
	if k := keepaliveInterval(req.Header()); k > 0 {
		t := time.NewTicker(k)
		defer t.Stop()
		tick = t.C
	}
	for {
		select {
		case <-ctx.Done():
			return rpcError(ctx.Err())
		case <-tick:
			if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Keepalive{Keepalive: &filesystem.WatchDirResponse_KeepAlive{}}}); err != nil {
				return err
			}
		case ev, ok := <-events:
			if !ok {
				// The watched directory went, or the sandbox did.
				if err := <-stopped; ctx.Err() == nil && !errors.Is(err, io.EOF) {
					sandboxGone()
				}
				return nil
			}
			if fe := c.fsEvent(ctx, dir, ev); fe != nil {
				if err := stream.Send(&filesystem.WatchDirResponse{Event: &filesystem.WatchDirResponse_Filesystem{Filesystem: fe}}); err != nil {
					return err
				}
			}
		}
	}
}

// fsEvent converts an agent watch event; names are relative to the watched
// directory, as envd sends them. An entry the agent looked up goes along.
func (c *call) fsEvent(ctx context.Context, dir string, ev api.WatchEvent) *filesystem.FilesystemEvent {
	fe := fsEvent(dir, ev)
	if fe != nil && ev.Entry != nil {
		fe.Entry = c.entry(ctx, *ev.Entry, true)
	}
	return fe
}

// fsEvent is an event's type and name.
func fsEvent(dir string, ev api.WatchEvent) *filesystem.FilesystemEvent {
	var t filesystem.EventType
	switch ev.Type {
	case api.WatchCreate:
		t = filesystem.EventType_EVENT_TYPE_CREATE
	case api.WatchWrite:
		t = filesystem.EventType_EVENT_TYPE_WRITE
	case api.WatchRemove:
		t = filesystem.EventType_EVENT_TYPE_REMOVE
	case api.WatchRename:
		t = filesystem.EventType_EVENT_TYPE_RENAME
	case api.WatchChmod:
		t = filesystem.EventType_EVENT_TYPE_CHMOD
	default:
		return nil
	}
	name := strings.TrimPrefix(strings.TrimPrefix(ev.Path, dir), "/")
	if dir == "/" {
		name = strings.TrimPrefix(ev.Path, "/")
	}
	return &filesystem.FilesystemEvent{Name: name, Type: t}
}

func (f *filesystemService) CreateWatcher(ctx context.Context, req *connect.Request[filesystem.CreateWatcherRequest]) (*connect.Response[filesystem.CreateWatcherResponse], error) {
	c := callFrom(ctx)
	m := req.Msg
	id, err := f.s.watchers.create(ctx, c, m.GetPath(), watchOptions(m.GetRecursive(), m.GetIncludeEntry(), m.GetAllowNetworkMounts()))
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.CreateWatcherResponse{WatcherId: id}), nil
}

func (f *filesystemService) GetWatcherEvents(ctx context.Context, req *connect.Request[filesystem.GetWatcherEventsRequest]) (*connect.Response[filesystem.GetWatcherEventsResponse], error) {
	evs, err := f.s.watchers.events(callFrom(ctx).sb.ID, req.Msg.GetWatcherId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.GetWatcherEventsResponse{Events: evs}), nil
}

func (f *filesystemService) RemoveWatcher(ctx context.Context, req *connect.Request[filesystem.RemoveWatcherRequest]) (*connect.Response[filesystem.RemoveWatcherResponse], error) {
	if err := f.s.watchers.remove(callFrom(ctx).sb.ID, req.Msg.GetWatcherId()); err != nil {
		return nil, err
	}
	return connect.NewResponse(&filesystem.RemoveWatcherResponse{}), nil
}
