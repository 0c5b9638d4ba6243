-- poisonq schema 5 (PostgreSQL): messages no longer carry a foreign key to entities. The key
-- checked every message row it touched (a lookup and a row lock per message sent or moved),
-- which cost about as much as the insert itself. The store now takes one key-share lock on the
-- target entity per statement that adds messages to it, and deletes an entity's messages
-- itself, after the entity rows (see delete_entity in store/postgres/transaction.py): the same
-- guarantee, that no message belongs to a deleted entity, at one check per statement.

ALTER TABLE messages DROP CONSTRAINT messages_entity_id_fkey;
