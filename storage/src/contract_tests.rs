//! The exported [`contract`](crate::testing::contract) suite run over this
//! crate's three engines: sled, memory and the segment-file log.

mod sled {
    crate::storage_contract!(crate::testing::contract::SledEngine);
}

mod memory {
    crate::storage_contract!(crate::testing::contract::MemoryEngine);
}

mod segments {
    crate::storage_contract!(crate::testing::contract::SegmentsEngine);
}
