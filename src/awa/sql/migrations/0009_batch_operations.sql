-- Reserved for 0009_batch_operations (being written).
SELECT 1;
