-- Reserved for 0008_descriptors (being written).
SELECT 1;
