package server

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"maps"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/api"
)

const specPath = "../../api/openapi.yaml"

var (
	specOnce sync.Once
	spec     *openapi3.T
	specErr  error
)

func loadSpec(t *testing.T) *openapi3.T {
	t.Helper()
	specOnce.Do(func() {
		loader := openapi3.NewLoader()
		spec, specErr = loader.LoadFromFile(specPath)
		if specErr == nil {
			specErr = spec.Validate(context.Background())
		}
	})
	if specErr != nil {
		t.Fatalf("%s: %v", specPath, specErr)
	}
	return spec
}

func TestOpenAPIValid(t *testing.T) {
	loadSpec(t)
}

// TestOpenAPIRoutes checks that the spec and the server's route table name the
// same operations, and that the spec marks auth as the server enforces it.
func TestOpenAPIRoutes(t *testing.T) {
	doc := loadSpec(t)
	s, err := New(Config{Sandboxes: &memSandboxes{}, Auth: keyAuth("k")})
	if err != nil {
		t.Fatal(err)
	}
	served := make(map[string]bool)
	for _, rt := range s.routes() {
		served[rt.pattern()] = true
		item := doc.Paths.Value(rt.path)
		if item == nil {
			t.Errorf("route %s: path missing from %s", rt.pattern(), specPath)
			continue
		}
		op := item.GetOperation(rt.method)
		if op == nil {
			t.Errorf("route %s: operation missing from %s", rt.pattern(), specPath)
			continue
		}
		public := op.Security != nil && len(*op.Security) == 0
		if public == rt.auth {
			t.Errorf("route %s: spec says public=%v, server says auth=%v", rt.pattern(), public, rt.auth)
		}
	}
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			if !served[method+" "+path] {
				t.Errorf("spec has %s %s; the server has no such route", method, path)
			}
		}
	}
}

// checkAgainstSpec validates one recorded answer of the server against the
// spec's response for its route. JSON bodies are checked against their schema;
// other bodies (NDJSON streams, raw files) only for a declared media type.
func checkAgainstSpec(t *testing.T, s *Server, req *http.Request, resp *http.Response, body []byte) {
	t.Helper()
	doc := loadSpec(t)
	_, pattern := s.mux.Handler(req)
	if pattern == "" {
		return // no route: nothing the spec describes
	}
	method, path, _ := strings.Cut(pattern, " ")
	item := doc.Paths.Value(path)
	if item == nil || item.GetOperation(method) == nil {
		t.Errorf("%s: not in the spec", pattern)
		return
	}
	op := item.GetOperation(method)
	route := &routers.Route{Spec: doc, Path: path, PathItem: item, Method: method, Operation: op}
	params := make(map[string]string)
	for _, seg := range strings.Split(path, "/") {
		if strings.HasPrefix(seg, "{") {
			name := strings.Trim(seg, "{}")
			params[name] = "x"
		}
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{
			Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc},
		},
		Status:  resp.StatusCode,
		Header:  resp.Header,
		Body:    io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	ct, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	if ct != "application/json" && len(body) > 0 {
		in.Options.ExcludeResponseBody = true
		ref := op.Responses.Status(resp.StatusCode)
		if ref == nil {
			ref = op.Responses.Default()
		}
		if ref != nil && ref.Value != nil && ref.Value.Content.Get(ct) == nil {
			t.Errorf("%s answered %d with Content-Type %q; spec declares %v", pattern, resp.StatusCode, ct, slices.Sorted(maps.Keys(ref.Value.Content)))
		}
		if ct == "application/x-ndjson" && ref != nil && ref.Value != nil {
			checkNDJSON(t, pattern, ref.Value.Content.Get(ct), body)
		}
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		t.Errorf("%s answered %d %s, which the spec does not allow: %v", pattern, resp.StatusCode, body, err)
	}
}

// checkNDJSON validates each line of an NDJSON body against the schema of mt.
func checkNDJSON(t *testing.T, pattern string, mt *openapi3.MediaType, body []byte) {
	t.Helper()
	if mt == nil || mt.Schema == nil || mt.Schema.Value == nil {
		return
	}
	for line := range bytes.Lines(body) {
		var v any
		if err := json.Unmarshal(line, &v); err != nil {
			t.Errorf("%s: NDJSON line %q: %v", pattern, line, err)
			continue
		}
		if err := mt.Schema.Value.VisitJSON(v); err != nil {
			t.Errorf("%s: NDJSON line %s does not match the spec: %v", pattern, bytes.TrimSpace(line), err)
		}
	}
}

// TestOpenAPISchemas checks that each schema has exactly the JSON fields of its
// api type, and that the fields Go always writes (no omitempty) are required.
func TestOpenAPISchemas(t *testing.T) {
	doc := loadSpec(t)
	for name, typ := range map[string]reflect.Type{
		"Error":                    reflect.TypeFor[api.Error](),
		"Health":                   reflect.TypeFor[api.Health](),
		"Sandbox":                  reflect.TypeFor[api.Sandbox](),
		"CreateSandboxRequest":     reflect.TypeFor[api.CreateSandboxRequest](),
		"SandboxList":              reflect.TypeFor[api.SandboxList](),
		"Snapshot":                 reflect.TypeFor[api.Snapshot](),
		"SnapshotList":             reflect.TypeFor[api.SnapshotList](),
		"CreateSnapshotRequest":    reflect.TypeFor[api.CreateSnapshotRequest](),
		"ForkRequest":              reflect.TypeFor[api.ForkRequest](),
		"RestoreRequest":           reflect.TypeFor[api.RestoreRequest](),
		"TimeoutRequest":           reflect.TypeFor[api.TimeoutRequest](),
		"SandboxNetwork":           reflect.TypeFor[api.SandboxNetwork](),
		"Placement":                reflect.TypeFor[api.Placement](),
		"PlacementCandidate":       reflect.TypeFor[api.PlacementCandidate](),
		"PlacementPart":            reflect.TypeFor[api.PlacementPart](),
		"PlacementFiltered":        reflect.TypeFor[api.PlacementFiltered](),
		"Metric":                   reflect.TypeFor[api.Metric](),
		"MetricList":               reflect.TypeFor[api.MetricList](),
		"NetworkPolicy":            reflect.TypeFor[api.NetworkPolicy](),
		"PTYSize":                  reflect.TypeFor[api.PTYSize](),
		"ExecRequest":              reflect.TypeFor[api.ExecRequest](),
		"ExecEvent":                reflect.TypeFor[api.ExecEvent](),
		"Process":                  reflect.TypeFor[api.Process](),
		"ProcessList":              reflect.TypeFor[api.ProcessList](),
		"SignalRequest":            reflect.TypeFor[api.SignalRequest](),
		"FileInfo":                 reflect.TypeFor[api.FileInfo](),
		"FileList":                 reflect.TypeFor[api.FileList](),
		"MkdirRequest":             reflect.TypeFor[api.MkdirRequest](),
		"RenameRequest":            reflect.TypeFor[api.RenameRequest](),
		"ChmodRequest":             reflect.TypeFor[api.ChmodRequest](),
		"WatchEvent":               reflect.TypeFor[api.WatchEvent](),
		"RunCodeRequest":           reflect.TypeFor[api.RunCodeRequest](),
		"CodeEvent":                reflect.TypeFor[api.CodeEvent](),
		"CodeContext":              reflect.TypeFor[api.CodeContext](),
		"CreateCodeContextRequest": reflect.TypeFor[api.CreateCodeContextRequest](),
		"Template":                 reflect.TypeFor[api.Template](),
		"TemplateList":             reflect.TypeFor[api.TemplateList](),
		"ImportTemplateRequest":    reflect.TypeFor[api.ImportTemplateRequest](),
		"ImportEvent":              reflect.TypeFor[api.ImportEvent](),
		"BuildEvent":               reflect.TypeFor[api.BuildEvent](),
		"APIKey":                   reflect.TypeFor[api.APIKey](),
		"APIKeyList":               reflect.TypeFor[api.APIKeyList](),
		"QuotaExceeded":            reflect.TypeFor[api.QuotaExceeded](),
		"TenantQuota":              reflect.TypeFor[api.TenantQuota](),
		"TenantUsage":              reflect.TypeFor[api.TenantUsage](),
		"Tenant":                   reflect.TypeFor[api.Tenant](),
		"TenantList":               reflect.TypeFor[api.TenantList](),
		"CreateKeyRequest":         reflect.TypeFor[api.CreateKeyRequest](),
		"VaultCredentials":         reflect.TypeFor[api.VaultCredentials](),
		"VaultCredentialsRequest":  reflect.TypeFor[api.VaultCredentialsRequest](),
	} {
		ref := doc.Components.Schemas[name]
		if ref == nil || ref.Value == nil {
			t.Errorf("schema %s missing", name)
			continue
		}
		var fields, always []string
		for f := range typ.Fields() {
			tag, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
			fields = append(fields, tag)
			if !strings.Contains(opts, "omitempty") {
				always = append(always, tag)
			}
		}
		slices.Sort(fields)
		slices.Sort(always)
		props := slices.Sorted(maps.Keys(ref.Value.Properties))
		if diff := cmp.Diff(fields, props); diff != "" {
			t.Errorf("schema %s properties differ from api.%s (-go +spec):\n%s", name, typ.Name(), diff)
		}
		required := slices.Sorted(slices.Values(ref.Value.Required))
		if strings.HasSuffix(name, "Request") || name == "PTYSize" {
			continue // requests may leave out what Go would write
		}
		if diff := cmp.Diff(always, required); diff != "" {
			t.Errorf("schema %s required differs from api.%s's fields without omitempty (-go +spec):\n%s", name, typ.Name(), diff)
		}
	}
}
