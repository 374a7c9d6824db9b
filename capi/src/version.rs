//! Version constants. They are literals (cbindgen turns them into `#define`s); a unit test
//! checks them against the crate version.

use std::ffi::CStr;

/// Major version of the library: a new major may change or remove anything in the C ABI.
pub const DSP_VERSION_MAJOR: u32 = 0;
/// Minor version: a new minor only adds (functions, status codes, enum values, constants).
pub const DSP_VERSION_MINOR: u32 = 2;
/// Patch version: fixes only, no change to the header.
pub const DSP_VERSION_PATCH: u32 = 0;

/// `dsp_version()`'s value.
pub(crate) const NUMBER: u32 =
    DSP_VERSION_MAJOR * 1_000_000 + DSP_VERSION_MINOR * 1_000 + DSP_VERSION_PATCH;

/// `dsp_version_string()`'s value.
pub(crate) const STRING: &CStr = c"0.2.0";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constants_match_the_crate_version() {
        let parse = |s: &str| s.parse::<u32>().expect("numeric version part");
        assert_eq!(DSP_VERSION_MAJOR, parse(env!("CARGO_PKG_VERSION_MAJOR")));
        assert_eq!(DSP_VERSION_MINOR, parse(env!("CARGO_PKG_VERSION_MINOR")));
        assert_eq!(DSP_VERSION_PATCH, parse(env!("CARGO_PKG_VERSION_PATCH")));
        assert_eq!(STRING.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
        assert_eq!(crate::dsp_version(), NUMBER);
    }
}
