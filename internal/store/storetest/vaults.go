package storetest

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/atoll-dev/atoll/internal/errdefs"
	"github.com/atoll-dev/atoll/internal/store"
	"github.com/atoll-dev/atoll/internal/tenant"
)

func newVault(id, t, name string) store.Vault {
	return store.Vault{ID: id, Tenant: t, Name: name, Layout: "agent", AllowRewrite: true,
		CreatedAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)}
}

// testVaults: vault records are per tenant, unique by name, listed by
// name, and deleted with their refs.
func testVaults(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	for _, v := range []store.Vault{newVault("v2", "", "notes"), newVault("v1", "acme", "notes"), newVault("v3", "acme", "alpha")} {
		if err := st.CreateVault(ctx, v); err != nil {
			t.Fatalf("CreateVault %s: %v", v.ID, err)
		}
	}
	if err := st.CreateVault(ctx, newVault("v4", "acme", "notes")); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second vault of one tenant and name: %v, want conflict", err)
	}
	if err := st.CreateVault(ctx, newVault("v1", "other", "x")); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a second vault of one ID: %v, want conflict", err)
	}
	// A tenant with only a vault is in use: a new key of its name would
	// reach the vault.
	if used, err := st.TenantInUse(ctx, "acme"); err != nil || !used {
		t.Errorf("TenantInUse of a tenant with vaults only = %v, %v; want true", used, err)
	}
	got, err := st.GetVault(ctx, tenant.Default, "notes")
	want := newVault("v2", tenant.Default, "notes")
	if err != nil || cmp.Diff(want, got) != "" {
		t.Errorf("GetVault: %v %s", err, cmp.Diff(want, got))
	}
	if _, err := st.GetVault(ctx, "other", "notes"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("another tenant's vault name: %v, want not found", err)
	}
	list, err := st.ListVaults(ctx, "acme")
	if err != nil || len(list) != 2 || list[0].Name != "alpha" || list[1].Name != "notes" {
		t.Errorf("ListVaults(acme) = %v, %v; want alpha, notes", list, err)
	}
	if err := st.UpdateVaultRefs(ctx, "v1", []store.RefUpdate{{Name: "refs/heads/main", New: "aa"}}, []string{"p1"}); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteVault(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.VaultState(ctx, "v1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("VaultState of a deleted vault: %v, want not found", err)
	}
	if err := st.DeleteVault(ctx, "v1"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteVault twice: %v, want not found", err)
	}
	// The name is free again; the new vault starts with no refs.
	if err := st.CreateVault(ctx, newVault("v5", "acme", "notes")); err != nil {
		t.Fatal(err)
	}
	refs, packs, err := st.VaultState(ctx, "v5")
	if err != nil || len(refs) != 0 || len(packs) != 0 {
		t.Errorf("a new vault's state: %v %v %v, want empty", refs, packs, err)
	}
	if _, err := st.GetVault(ctx, "acme", "no\x00such"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a name with NUL: %v, want not found", err)
	}
}

// testVaultRefs: ref updates are compare-and-set on the old values, all or
// nothing with their packs, and survive a reopen.
func testVaultRefs(t *testing.T, s suite) {
	ctx := context.Background()
	dir := t.TempDir()
	st, closeFn := s.at(t, dir)
	if err := st.CreateVault(ctx, newVault("v1", "", "notes")); err != nil {
		t.Fatal(err)
	}
	main, tag := "refs/heads/main", "refs/tags/v1"
	if err := st.UpdateVaultRefs(ctx, "v1", []store.RefUpdate{{Name: main, New: "a1"}, {Name: tag, New: "t1"}}, []string{"p1"}); err != nil {
		t.Fatal(err)
	}
	// One stale old value refuses the whole update, its packs too.
	err := st.UpdateVaultRefs(ctx, "v1", []store.RefUpdate{{Name: main, Old: "a1", New: "a2"}, {Name: tag, Old: "zz", New: "t2"}}, []string{"p2"})
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("a stale old value: %v, want conflict", err)
	}
	if err := st.UpdateVaultRefs(ctx, "v1", []store.RefUpdate{{Name: "refs/heads/new", Old: "x", New: "b1"}}, nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("an old value for a ref that does not exist: %v, want conflict", err)
	}
	refs, packs, err := st.VaultState(ctx, "v1")
	if err != nil || cmp.Diff(map[string]string{main: "a1", tag: "t1"}, refs) != "" || cmp.Diff([]string{"p1"}, packs) != "" {
		t.Errorf("after refused updates: %v %v %v", refs, packs, err)
	}
	// Concurrent updates from the same old value: exactly one wins.
	var wg sync.WaitGroup
	var mu sync.Mutex
	won := 0
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := st.UpdateVaultRefs(ctx, "v1", []store.RefUpdate{{Name: main, Old: "a1", New: fmt.Sprintf("c%d", i)}}, []string{fmt.Sprintf("q%d", i)})
			if err == nil {
				mu.Lock()
				won++
				mu.Unlock()
			} else if !errors.Is(err, errdefs.ErrConflict) {
				t.Errorf("concurrent update: %v, want nil or conflict", err)
			}
		}()
	}
	wg.Wait()
	if won != 1 {
		t.Errorf("%d concurrent updates from one old value won, want 1", won)
	}
	// Deletion, and a pack name given twice recorded once.
	if err := st.UpdateVaultRefs(ctx, "v1", []store.RefUpdate{{Name: tag, Old: "t1"}}, []string{"p1", "p3"}); err != nil {
		t.Fatal(err)
	}
	if err := st.UpdateVaultRefs(ctx, "nope", nil, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("UpdateVaultRefs of no vault: %v, want not found", err)
	}
	// Packs replaced by one that holds them: it comes first, the others
	// stay; a pack no longer recorded refuses the whole replacement.
	_, packs, _ = st.VaultState(ctx, "v1") // p1, the winner's q, p3
	if err := st.ReplaceVaultPacks(ctx, "v1", []string{"p1", "nope"}, "all"); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("replacing a pack not recorded: %v, want conflict", err)
	}
	if err := st.ReplaceVaultPacks(ctx, "v1", packs[:2], "all"); err != nil {
		t.Fatal(err)
	}
	if err := st.ReplaceVaultPacks(ctx, "nope", nil, "all"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("ReplaceVaultPacks of no vault: %v, want not found", err)
	}
	if err := closeFn(); err != nil {
		t.Fatal(err)
	}
	st, _ = s.at(t, dir)
	refs, packs, err = st.VaultState(ctx, "v1")
	if err != nil || len(refs) != 1 || refs[main] == "a1" || cmp.Diff([]string{"all", "p3"}, packs) != "" {
		t.Errorf("after reopen: %v %v %v; want main moved, the tag gone, packs all, p3", refs, packs, err)
	}
	// Packs appended after a replacement come after it.
	if err := st.UpdateVaultRefs(ctx, "v1", nil, []string{"p4"}); err != nil {
		t.Fatal(err)
	}
	if _, packs, _ = st.VaultState(ctx, "v1"); cmp.Diff([]string{"all", "p3", "p4"}, packs) != "" {
		t.Errorf("a pack after the replacement: %v", packs)
	}
}

// testVaultSchedules: a schedule is set and read back, found due once
// its time has come, claimed by one of the racers only, removed with its
// vault; events come newest first, the oldest past MaxVaultEvents
// dropped.
func testVaultSchedules(t *testing.T, s suite) {
	ctx := context.Background()
	st := s.fresh(t)
	for _, v := range []store.Vault{newVault("v1", "acme", "notes"), newVault("v2", "acme", "other")} {
		if err := st.CreateVault(ctx, v); err != nil {
			t.Fatal(err)
		}
	}
	if sc, err := st.VaultSchedule(ctx, "v1"); err != nil || sc.Every != "" || sc.Summarizer != "" {
		t.Errorf("no schedule: %+v, %v", sc, err)
	}
	at := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	if err := st.SetVaultSchedule(ctx, store.VaultSchedule{VaultID: "nope", Every: "daily", Next: at}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("a schedule of no vault: %v, want not found", err)
	}
	want := store.VaultSchedule{VaultID: "v1", Every: "daily", Summarizer: "llm --short", Next: at}
	if err := st.SetVaultSchedule(ctx, want); err != nil {
		t.Fatal(err)
	}
	// v2 has a summarizer but no schedule: never due.
	if err := st.SetVaultSchedule(ctx, store.VaultSchedule{VaultID: "v2", Summarizer: "x"}); err != nil {
		t.Fatal(err)
	}
	if got, err := st.VaultSchedule(ctx, "v1"); err != nil || !cmp.Equal(got, want) {
		t.Errorf("VaultSchedule = %+v, %v; want %+v", got, err, want)
	}
	if due, err := st.DueVaultSchedules(ctx, at.Add(-time.Second), 10); err != nil || len(due) != 0 {
		t.Errorf("due before its time: %+v, %v", due, err)
	}
	due, err := st.DueVaultSchedules(ctx, at, 10)
	if err != nil || len(due) != 1 || due[0].VaultID != "v1" || due[0].Tenant != "acme" || due[0].Name != "notes" || !due[0].Next.Equal(at) {
		t.Fatalf("due: %+v, %v", due, err)
	}
	// Racers claim it: one wins.
	next := at.AddDate(0, 0, 1)
	var wins int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, err := st.ClaimVaultSchedule(ctx, "v1", due[0].Next, next)
			if err != nil {
				t.Error(err)
			}
			if ok {
				mu.Lock()
				wins++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if wins != 1 {
		t.Errorf("%d claims won, want 1", wins)
	}
	if due, _ := st.DueVaultSchedules(ctx, at.Add(time.Hour), 10); len(due) != 0 {
		t.Errorf("due after the claim: %+v", due)
	}
	// Off: never due.
	if err := st.SetVaultSchedule(ctx, store.VaultSchedule{VaultID: "v1"}); err != nil {
		t.Fatal(err)
	}
	if due, _ := st.DueVaultSchedules(ctx, next.AddDate(1, 0, 0), 10); len(due) != 0 {
		t.Errorf("due while off: %+v", due)
	}
	if ok, _ := st.ClaimVaultSchedule(ctx, "v1", time.Time{}, next); ok {
		t.Errorf("an off schedule was claimed")
	}

	// Events.
	for i := range store.MaxVaultEvents + 3 {
		e := store.VaultEvent{VaultID: "v1", At: at.Add(time.Duration(i) * time.Minute), Kind: "compact", Trigger: "schedule", Detail: fmt.Sprint(i)}
		if i == store.MaxVaultEvents+2 {
			e.Error, e.Detail = "summarizer exited 1: boom", ""
		}
		if err := st.AddVaultEvent(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.AddVaultEvent(ctx, store.VaultEvent{VaultID: "nope", At: at, Kind: "compact"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("an event of no vault: %v, want not found", err)
	}
	evs, err := st.VaultEvents(ctx, "v1", 1000)
	if err != nil || len(evs) != store.MaxVaultEvents {
		t.Fatalf("events: %d, %v; want %d", len(evs), err, store.MaxVaultEvents)
	}
	if evs[0].Error != "summarizer exited 1: boom" || !evs[0].At.Equal(at.Add(time.Duration(store.MaxVaultEvents+2)*time.Minute)) || evs[len(evs)-1].Detail != "3" {
		t.Errorf("events: newest %+v, oldest %+v", evs[0], evs[len(evs)-1])
	}
	if evs, _ := st.VaultEvents(ctx, "v1", 2); len(evs) != 2 {
		t.Errorf("limit 2: %d events", len(evs))
	}
	// Deleting the vault deletes its schedule and events.
	if err := st.DeleteVault(ctx, "v1"); err != nil {
		t.Fatal(err)
	}
	if evs, _ := st.VaultEvents(ctx, "v1", 10); len(evs) != 0 {
		t.Errorf("events of a deleted vault: %d", len(evs))
	}
	if sc, _ := st.VaultSchedule(ctx, "v1"); sc.Every != "" || sc.Summarizer != "" {
		t.Errorf("schedule of a deleted vault: %+v", sc)
	}
}
