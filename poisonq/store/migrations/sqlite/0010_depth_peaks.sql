-- poisonq schema 10: the highest depth each depth_history bucket reached (after any commit
-- in it, or the depth it opened with), so an hour's chart shows a backlog that came and went
-- within the hour. Rows written before this script have none (NULL): a chart then falls
-- back to the depths it can read back (each bucket's opening depth and the bar's end).
ALTER TABLE depth_history ADD COLUMN peak INTEGER;
