//! Generates the C-API fuzz driver's declarations from the committed header, so the driver
//! calls `libdistspmm` exactly as a C host compiled against `include/distspmm.h` does.

fn main() {
    let header = concat!(env!("CARGO_MANIFEST_DIR"), "/../include/distspmm.h");
    println!("cargo:rerun-if-changed={header}");
    let bindings = bindgen::Builder::default()
        .header(header)
        .allowlist_function("dsp_.*")
        .allowlist_type("dsp_.*")
        .allowlist_var("DSP_.*")
        .prepend_enum_name(false)
        .generate()
        .expect("bindgen cannot read include/distspmm.h");
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    bindings
        .write_to_file(out.join("distspmm_sys.rs"))
        .expect("write the generated bindings");
}
