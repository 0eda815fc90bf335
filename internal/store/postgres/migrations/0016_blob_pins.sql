-- Pins on template layers' objects (store.BlobPins): a node making a
-- version pins, under a name of its own, each object the version will
-- name before it looks for it, and ends its pins once the version is
-- recorded. A node deleting an object deletes nothing pinned; both hold
-- a transaction lock on the object's key (an advisory lock of its hash),
-- which orders them.
CREATE TABLE blob_pins (
	key text NOT NULL,
	pin text NOT NULL,
	until timestamptz NOT NULL,
	PRIMARY KEY (key, pin)
);
CREATE INDEX blob_pins_pin ON blob_pins (pin);
