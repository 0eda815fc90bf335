package store

// SQL that both stores (sqlite, postgres) run as written.

// UnheldVersion is the condition on a template_versions row v that
// nothing holds it: no name points to it and no sandbox or snapshot was
// made from it (see Templates). CollectTemplates deletes the versions it
// holds for.
const UnheldVersion = `NOT EXISTS (SELECT 1 FROM template_names n WHERE n.version = v.id)
	AND NOT EXISTS (SELECT 1 FROM sandboxes s WHERE s.template_version = v.id)
	AND NOT EXISTS (SELECT 1 FROM snapshots p WHERE p.template_version = v.id)`
