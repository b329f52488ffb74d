-- Reserved for 0007_dlq (being written).
SELECT 1;
