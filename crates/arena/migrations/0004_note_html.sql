-- A note rendered to sanitised HTML once (at intake, or on the first view of a note stored
-- before this column existed); the pages serve it as it is (issue 42). NULL: not rendered yet.
ALTER TABLE submissions ADD COLUMN note_html TEXT;
