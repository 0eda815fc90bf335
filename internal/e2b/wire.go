package e2b

import (
	"encoding/json"
	"math"
	"time"

	"github.com/atoll-dev/atoll/api"
	"github.com/atoll-dev/atoll/internal/e2b/envd"
)

// E2B's JSON bodies, as spec/openapi.yml of e2b-dev/E2B and the types the
// SDKs generate from it name them. Only what atoll reads or answers.

// newSandbox is the body of POST /sandboxes and POST /v2/sandboxes.
type newSandbox struct {
	TemplateID          string      `json:"templateID"`
	Timeout             *int64      `json:"timeout"` // seconds
	AutoPause           *bool       `json:"autoPause"`
	AutoPauseMemory     *bool       `json:"autoPauseMemory"`
	AutoResume          *autoResume `json:"autoResume"`
	Secure              *bool       `json:"secure"`
	AllowInternetAccess *bool       `json:"allow_internet_access"`
	// allowInternetAccess is how E2B's docs spell it in places.
	AllowInternetAccessCamel *bool             `json:"allowInternetAccess"`
	Network                  *networkConfig    `json:"network"`
	Metadata                 map[string]string `json:"metadata"`
	EnvVars                  map[string]string `json:"envVars"`
	MCP                      json.RawMessage   `json:"mcp"`
	IAM                      json.RawMessage   `json:"iam"`
	VolumeMounts             []json.RawMessage `json:"volumeMounts"`
}

type autoResume struct {
	Enabled bool `json:"enabled"`
}

type networkConfig struct {
	AllowPublicTraffic *bool           `json:"allowPublicTraffic"`
	AllowOut           []string        `json:"allowOut"`
	DenyOut            []string        `json:"denyOut"`
	EgressProxy        json.RawMessage `json:"egressProxy"`
	MaskRequestHost    *string         `json:"maskRequestHost"`
	HTTPSPorts         []int           `json:"httpsPorts"`
	Rules              json.RawMessage `json:"rules"`
}

// sandbox is E2B's Sandbox: what create, connect, resume and fork answer.
type sandbox struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"` // deprecated in E2B, still required
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken,omitempty"`
	TrafficAccessToken *string `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// listedSandbox is an item of GET /v2/sandboxes.
type listedSandbox struct {
	TemplateID   string            `json:"templateID"`
	Alias        string            `json:"alias,omitempty"`
	SandboxID    string            `json:"sandboxID"`
	ClientID     string            `json:"clientID"`
	StartedAt    time.Time         `json:"startedAt"`
	EndAt        time.Time         `json:"endAt"`
	CPUCount     int               `json:"cpuCount"`
	MemoryMB     int64             `json:"memoryMB"`
	DiskSizeMB   int64             `json:"diskSizeMB"`
	Metadata     map[string]string `json:"metadata"`
	State        string            `json:"state"`
	EnvdVersion  string            `json:"envdVersion"`
	VolumeMounts []struct{}        `json:"volumeMounts"`
}

// sandboxMetric is an item of GET /sandboxes/{id}/metrics and a value of
// GET /sandboxes/metrics.
type sandboxMetric struct {
	Timestamp     time.Time `json:"timestamp"` // deprecated in E2B, still required
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// sandboxesWithMetrics is GET /sandboxes/metrics.
type sandboxesWithMetrics struct {
	Sandboxes map[string]sandboxMetric `json:"sandboxes"`
}

// sandboxDetail is GET /sandboxes/{id}.
type sandboxDetail struct {
	listedSandbox
	EnvdAccessToken     string       `json:"envdAccessToken,omitempty"`
	AllowInternetAccess *bool        `json:"allowInternetAccess"`
	Network             *networkInfo `json:"network,omitempty"`
	Domain              *string      `json:"domain"`
	Lifecycle           *lifecycle   `json:"lifecycle,omitempty"`
}

type lifecycle struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"` // "kill" or "pause"
}

// pauseRequest is the optional body of POST /sandboxes/{id}/pause: the
// SDK sends its keepMemory as memory.
type pauseRequest struct {
	Memory *bool `json:"memory"`
}

type timeoutRequest struct {
	Timeout *int64 `json:"timeout"`
}

type refreshRequest struct {
	Duration int64 `json:"duration"`
}

type connectRequest struct {
	Timeout *int64 `json:"timeout"`
}

// timed is a request body with E2B's timeout field.
type timed interface{ timeout() *int64 }

func (c connectRequest) timeout() *int64 { return c.Timeout }

type forkRequest struct {
	connectRequest      // timeout
	Count          *int `json:"count"`
}

type forkResult struct {
	Sandbox *sandbox  `json:"sandbox,omitempty"`
	Error   *apiError `json:"error,omitempty"`
}

type snapshotRequest struct {
	Name string `json:"name"`
}

type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

// clientID fills a field E2B deprecated but its schema still requires.
const clientID = "atoll"

// E2B states. atoll's stopped (and archived) sandboxes show as paused:
// connect brings them back, as it resumes E2B's paused ones.
const (
	stateRunning = "running"
	statePaused  = "paused"
)

// e2bState is how an atoll state shows in E2B; false: not at all (being
// deleted, or failed).
func e2bState(state string) (string, bool) {
	switch state {
	case api.StateRunning, api.StateCreating, api.StateStarting:
		return stateRunning, true
	case api.StatePaused, api.StateSuspending, api.StateSuspended, api.StateShelved, api.StateStopping, api.StateStopped, api.StateArchiving, api.StateArchived:
		return statePaused, true
	}
	return "", false
}

// noTimeoutEnd is what endAt says of a sandbox without a timeout: E2B's
// always have one.
const noTimeoutEnd = 365 * 24 * time.Hour

func (s *Server) listed(sb api.Sandbox) listedSandbox {
	state, _ := e2bState(sb.State)
	started := sb.CreatedAt
	if sb.StartedAt != nil {
		started = *sb.StartedAt
	}
	end := started.Add(noTimeoutEnd)
	if sb.ExpiresAt != nil {
		end = *sb.ExpiresAt
	}
	md := sb.Labels
	if md == nil {
		md = map[string]string{}
	}
	return listedSandbox{
		TemplateID:   sb.Template,
		Alias:        s.reverse[sb.Template],
		SandboxID:    sb.ID,
		ClientID:     clientID,
		StartedAt:    started.UTC(),
		EndAt:        end.UTC(),
		CPUCount:     max(1, int(math.Ceil(sb.CPU))),
		MemoryMB:     sb.MemoryMiB,
		DiskSizeMB:   sb.DiskGiB * 1024,
		Metadata:     md,
		State:        state,
		EnvdVersion:  envd.Version,
		VolumeMounts: []struct{}{},
	}
}

func (s *Server) detail(sb api.Sandbox) sandboxDetail {
	onTimeout := "pause"
	if sb.Ephemeral {
		onTimeout = "kill"
	}
	internet, network := e2bNetwork(sb)
	return sandboxDetail{
		listedSandbox:       s.listed(sb),
		EnvdAccessToken:     s.accessToken(sb.ID),
		AllowInternetAccess: &internet,
		Network:             network,
		Lifecycle:           &lifecycle{OnTimeout: onTimeout, AutoResume: sb.AutoResume},
	}
}

func (s *Server) sandbox(sb api.Sandbox) *sandbox {
	out := &sandbox{
		TemplateID:      sb.Template,
		SandboxID:       sb.ID,
		Alias:           s.reverse[sb.Template],
		ClientID:        clientID,
		EnvdVersion:     envd.Version,
		EnvdAccessToken: s.accessToken(sb.ID),
	}
	// A sandbox whose ports are not public gets E2B's traffic access
	// token: atoll's port token, which opens every port of it.
	if !sb.Ports.Public && s.cfg.Ports != nil {
		tok := s.cfg.Ports.Token(sb.ID)
		out.TrafficAccessToken = &tok
	}
	return out
}
