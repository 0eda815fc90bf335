package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/atoll-dev/atoll/api"
	atoll "github.com/atoll-dev/atoll/sdk/go"
)

// TestCreateFlood floods a server that takes one create at a time, with two
// more waiting, far beyond that: every answer is a 201, or a 503 (429) with
// a Retry-After and a JSON error, never a 5xx of another kind nor a hang;
// the Go SDK rides the refusals out by itself, returns them as errors that
// say when to retry when told not to, and the CLI's create retries too.
// Nothing refused leaves anything behind.
func TestCreateFlood(t *testing.T) {
	d, data, c := startRooted(t, "--warm-pool", "0", "--prestart", "0", "--create-concurrency", "1", "--create-queue", "2")
	ctx := context.Background()
	// The first create makes the template's layer images, which stay.
	before := warmBaseline(ctx, t, c, data)

	// The raw answers to 24 creates at once.
	const flood = 24
	type answer struct {
		status     int
		retryAfter string
		body       api.Error
		id         string
	}
	answers, err := atOnce(flood, func(i int) (answer, error) {
		req, _ := http.NewRequest("POST", d.url+"/v1/sandboxes", strings.NewReader("{}"))
		req.Header.Set("Authorization", "Bearer "+d.key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return answer{}, fmt.Errorf("create %d: %v", i, err)
		}
		defer resp.Body.Close()
		a := answer{status: resp.StatusCode, retryAfter: resp.Header.Get("Retry-After")}
		if resp.StatusCode == http.StatusCreated {
			var sb api.Sandbox
			json.NewDecoder(resp.Body).Decode(&sb)
			a.id = sb.ID
		} else {
			json.NewDecoder(resp.Body).Decode(&a.body)
		}
		return a, nil
	})
	if err != nil {
		t.Error(err)
	}
	var created, refused int
	var ids []string
	for i, a := range answers {
		switch a.status {
		case http.StatusCreated:
			created++
			ids = append(ids, a.id)
		case http.StatusServiceUnavailable, http.StatusTooManyRequests:
			refused++
			if secs, err := strconv.Atoi(a.retryAfter); err != nil || secs < 1 {
				t.Errorf("create %d: %d with Retry-After %q, want whole seconds", i, a.status, a.retryAfter)
			}
			if a.body.Code == "" || a.body.Message == "" {
				t.Errorf("create %d: %d without a JSON error body: %+v", i, a.status, a.body)
			}
		default:
			t.Errorf("create %d: status %d (%+v), want 201, or 503/429 with Retry-After", i, a.status, a.body)
		}
	}
	if created == 0 || refused == 0 {
		t.Errorf("%d creates answered 201 and %d refused: the flood should see both", created, refused)
	}

	// Told not to retry, the SDK says when to.
	noRetry := atoll.New(d.url, d.key, atoll.WithBusyRetries(0))
	var busy []error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := noRetry.CreateSandbox(ctx, api.CreateSandboxRequest{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				busy = append(busy, err)
				return
			}
			ids = append(ids, sb.ID)
		}()
	}
	wg.Wait()
	if len(busy) == 0 {
		t.Error("8 creates at once without retries were all taken by a server that takes 3")
	}
	for _, err := range busy {
		var e *atoll.Error
		if !errors.As(err, &e) || !errors.Is(err, atoll.ErrUnavailable) || e.RetryAfter <= 0 {
			t.Errorf("refused create: %v (%#v), want an *atoll.Error of ErrUnavailable with RetryAfter", err, e)
		}
	}

	// By default it retries: 8 at once all get their sandbox, and so does
	// the CLI's create beside them.
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sb, err := c.CreateSandbox(ctx, api.CreateSandboxRequest{})
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("create with retries: %v", err)
				return
			}
			ids = append(ids, sb.ID)
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		out, code := d.cli("create")
		if code != 0 {
			t.Errorf("atoll create beside the flood: exit %d: %s", code, out)
			return
		}
		mu.Lock()
		ids = append(ids, strings.TrimSpace(out))
		mu.Unlock()
	}()
	wg.Wait()

	for _, id := range ids {
		if err := c.DeleteSandbox(ctx, id); err != nil {
			t.Errorf("delete %s: %v", id, err)
		}
	}
	if l := leftSince(t, before, data); len(l) > 0 {
		t.Errorf("left on the host after deleting everything: %v", l)
	}
}
