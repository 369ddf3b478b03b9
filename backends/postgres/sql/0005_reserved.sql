-- Placeholder: version 5 belongs to another branch of this release; this file goes when it lands.
SELECT 1;
