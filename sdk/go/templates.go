package atoll

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/url"
	"slices"

	"github.com/atoll-dev/atoll/api"
)

// ImportTemplate imports the image req.Ref from a registry as template
// req.Name. progress, if not nil, is called with each "progress" event while
// layers arrive. A failed import returns an *Error, as any other call does.
func (c *Client) ImportTemplate(ctx context.Context, req api.ImportTemplateRequest, progress func(api.ImportEvent)) (api.Template, error) {
	return c.importTemplate(ctx, request{method: "POST", path: "/v1/templates/import", json: req}, progress)
}

// ImportTemplateArchive imports the image in r, a `docker save` or OCI archive
// (a tar stream; an OCI layout directory must be tarred first), as template
// name. r is streamed to the server, which reports progress while it reads.
func (c *Client) ImportTemplateArchive(ctx context.Context, name string, r io.Reader, progress func(api.ImportEvent)) (api.Template, error) {
	return c.importTemplate(ctx, request{
		method: "POST", path: "/v1/templates/import", query: url.Values{"name": {name}},
		body: r, ctype: "application/x-tar",
	}, progress)
}

func (c *Client) importTemplate(ctx context.Context, r request, progress func(api.ImportEvent)) (api.Template, error) {
	resp, err := c.send(ctx, r)
	if err != nil {
		return api.Template{}, err
	}
	defer resp.Body.Close()
	return readImport(resp.Body, progress)
}

// readImport reads an import's NDJSON stream up to its done or error event.
func readImport(body io.Reader, progress func(api.ImportEvent)) (api.Template, error) {
	return readEvents(body, "import", []string{"progress"}, progress)
}

// BuildOptions are the optional parameters of BuildTemplate.
type BuildOptions struct {
	// Dockerfile is the Dockerfile's slash-separated path inside the build
	// context; "" means "Dockerfile".
	Dockerfile string
	// BuildArgs are the values of the Dockerfile's ARGs, as docker build
	// --build-arg gives them.
	BuildArgs map[string]string
}

// BuildTemplate builds template name from the Dockerfile in buildContext, a
// tar stream of the build context that is streamed to the server while it
// builds. events, if not nil, is called with each "step" and "log" event as
// the build goes on. A failed build returns an *Error, as any other call does.
func (c *Client) BuildTemplate(ctx context.Context, name string, opts BuildOptions, buildContext io.Reader, events func(api.BuildEvent)) (api.Template, error) {
	q := url.Values{"name": {name}}
	if opts.Dockerfile != "" {
		q.Set("dockerfile", opts.Dockerfile)
	}
	for _, k := range slices.Sorted(maps.Keys(opts.BuildArgs)) {
		q.Add("build_arg", k+"="+opts.BuildArgs[k])
	}
	resp, err := c.send(ctx, request{
		method: "POST", path: "/v1/templates/build", query: q,
		body: buildContext, ctype: "application/x-tar",
	})
	if err != nil {
		return api.Template{}, err
	}
	defer resp.Body.Close()
	return readBuild(resp.Body, events)
}

// readBuild reads a build's NDJSON stream up to its done or error event.
func readBuild(body io.Reader, events func(api.BuildEvent)) (api.Template, error) {
	return readEvents(body, "build", []string{"step", "log"}, events)
}

// readEvents reads the NDJSON event stream of an import or a build (op) up
// to its done or error event, handing the events of the types in pass to
// events if it is not nil.
func readEvents[E any](body io.Reader, op string, pass []string, events func(E)) (api.Template, error) {
	dec := json.NewDecoder(body)
	for {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if err == io.EOF {
				return api.Template{}, fmt.Errorf("%s: stream ended before the %s finished", op, op)
			}
			return api.Template{}, fmt.Errorf("%s: reading stream: %w", op, err)
		}
		// The fields every event type has; the rest are E's.
		var end struct {
			Type          string
			Template      *api.Template
			Code, Message string
		}
		if err := json.Unmarshal(raw, &end); err != nil {
			return api.Template{}, fmt.Errorf("%s: reading stream: %w", op, err)
		}
		switch {
		case end.Type == "done":
			if end.Template == nil {
				return api.Template{}, fmt.Errorf("%s: done event without a template", op)
			}
			return *end.Template, nil
		case end.Type == "error":
			return api.Template{}, errorOfCode(end.Code, end.Message)
		case events != nil && slices.Contains(pass, end.Type):
			var ev E
			if err := json.Unmarshal(raw, &ev); err != nil {
				return api.Template{}, fmt.Errorf("%s: reading stream: %w", op, err)
			}
			events(ev)
		}
	}
}

// ListTemplates returns the server's templates.
func (c *Client) ListTemplates(ctx context.Context) ([]api.Template, error) {
	l, err := call[api.TemplateList](ctx, c, request{method: "GET", path: "/v1/templates"})
	return l.Templates, err
}

// GetTemplate returns template name.
func (c *Client) GetTemplate(ctx context.Context, name string) (api.Template, error) {
	return call[api.Template](ctx, c, request{method: "GET", path: templatePath(name)})
}

// DeleteTemplate removes the template name name. Its versions stay while
// sandboxes, snapshots or other names hold them; the answer lists those.
func (c *Client) DeleteTemplate(ctx context.Context, name string) (api.TemplateRemoved, error) {
	return call[api.TemplateRemoved](ctx, c, request{method: "DELETE", path: templatePath(name)})
}

// BootstrapTemplate makes a base template with debootstrap on the server;
// events receives its log.
func (c *Client) BootstrapTemplate(ctx context.Context, req api.BootstrapTemplateRequest, events func(api.BuildEvent)) (api.Template, error) {
	resp, err := c.send(ctx, request{method: "POST", path: "/v1/templates/bootstrap", json: req})
	if err != nil {
		return api.Template{}, err
	}
	defer resp.Body.Close()
	return readBuild(resp.Body, events)
}

// TagTemplate points the name tag at the current version of template name
// (or at NAME@VERSION).
func (c *Client) TagTemplate(ctx context.Context, name, tag string) (api.Template, error) {
	return call[api.Template](ctx, c, request{method: "POST", path: templatePath(name) + "/tag", json: api.TagTemplateRequest{Tag: tag}})
}

func templatePath(name string) string {
	return "/v1/templates/" + url.PathEscape(name)
}
